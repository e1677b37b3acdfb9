"""The post-hoc reads (bayesattn.posthoc): one estimator shape, one feature pass, the density
read on a plain torch encoder, a converted one, a small BERT and our networks (CLS and mean
pooled), saving and loading, the input checks, the old names' deprecation."""

from __future__ import annotations

import io
import math

import pytest
import torch
from torch import nn

from bayesattn.functional.niw import student_t_log_prob, student_t_log_prob_batched
from bayesattn.nn.networks import TransformerClassifier, VisionTransformer
from bayesattn.posthoc import (
    DensityRead,
    Features,
    GPRead,
    PosthocRead,
    TemperatureRead,
    extract_features,
)
from bayesattn.posthoc._density_core import fit_class_density
from bayesattn.predictive import PredictionResult


class Encoder(nn.Module):
    """A plain torch classifier: embedding, a batch-first TransformerEncoder, first-token head."""

    def __init__(self, vocab: int = 20, d: int = 16, classes: int = 3) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        layer = nn.TransformerEncoderLayer(d, 2, 32, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(d, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(self.embed(x))  # (B, T, E)
        return self.head(h[:, 0])


def _data(n: int = 150, classes: int = 3, T: int = 6, vocab: int = 20, seed: int = 0):
    """Token sequences whose class is their first token's bucket (learnable by no one here:
    the reads only need features and labels)."""
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % classes
    x = torch.randint(1, vocab, (n, T), generator=g)
    x[:, 0] = 1 + y * (vocab // classes - 1) // 1
    return x, y


def _manual(model: Encoder, x: torch.Tensor) -> Features:
    """The encoder's features computed by hand, a second implementation of the hooked pass."""
    with torch.no_grad():
        h = model.encoder(model.embed(x))
        return Features(model.head(h[:, 0]), h[:, 0], h.mean(1))


def _fit_density(model: nn.Module, x: torch.Tensor, y: torch.Tensor, **kw) -> DensityRead:
    return DensityRead(model, **kw).fit(x[:90], y[:90], val=(x[90:], y[90:]))


def test_hooked_features_of_a_torch_encoder_are_its_head_input_and_token_mean():
    torch.manual_seed(0)
    model = Encoder().eval()
    x, _ = _data(40)
    f = extract_features(model, x, batch_size=16)
    want = _manual(model, x)
    for got, ref in zip(f, want, strict=True):
        torch.testing.assert_close(got, ref, atol=1e-6, rtol=0)


def test_density_read_on_a_torch_encoder_is_the_core_read_of_its_features():
    """The read's score and predictive equal the NIW core fitted on hand-computed features."""
    torch.manual_seed(0)
    model = Encoder().eval()
    x, y = _data()
    read = _fit_density(model, x, y)
    assert isinstance(read, PosthocRead) and read.views == ("cls", "tokens")
    ft, fv, fq = _manual(model, x[:90]), _manual(model, x[90:]), _manual(model, x[:12])
    core = fit_class_density([ft.cls, ft.tokens], y[:90], [fv.cls, fv.tokens], y[90:], 3,
                             val_logits=fv.logits)  # fmt: skip
    res, score = read.predict_and_score(x[:12])
    assert isinstance(res, PredictionResult) and res.probs.shape == (1, 12, 3)
    torch.testing.assert_close(score, core.score([fq.cls, fq.tokens]), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(res.probs[0], core.probs(fq.logits, [fq.cls, fq.tokens]).float(),
                               atol=1e-6, rtol=1e-6)  # fmt: skip
    torch.testing.assert_close(read.score(x[:12]), score)
    assert read.kl() == pytest.approx(core.kl()) and read.kl() > 0


def test_predict_and_score_is_one_forward_pass():
    torch.manual_seed(0)
    model = Encoder().eval()
    x, y = _data()
    read = _fit_density(model, x, y)
    calls = []
    handle = model.register_forward_hook(lambda *a: calls.append(1))
    read.predict_and_score(x[:30])
    handle.remove()
    assert len(calls) == 1


def test_density_read_on_a_converted_encoder():
    from bayesattn.interop import convert

    torch.manual_seed(0)
    plain = Encoder().eval()
    x, y = _data()
    before = _fit_density(plain, x, y).score(x[:10])
    model = convert(plain, family="dirichlet")
    read = _fit_density(model, x, y)
    # features read with posterior-mean attention: the converted model reads as it was made from
    torch.testing.assert_close(read.score(x[:10]), before, atol=1e-4, rtol=1e-4)
    assert torch.equal(read.score(x[:10]), read.score(x[:10]))


def test_density_read_on_a_small_bert():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=32, vocab_size=30, num_labels=3,
                                  attn_implementation="eager")  # fmt: skip
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(cfg).eval()
    x, y = _data(vocab=30)
    mask = torch.ones_like(x)
    mask[::2, -2:] = 0  # padding at the end of every other sequence
    inputs = {"input_ids": x, "attention_mask": mask}
    fwd = lambda m, b: m(**b).logits  # noqa: E731
    take = lambda s: {k: v[s] for k, v in inputs.items()}  # noqa: E731
    read = DensityRead(model, forward=fwd).fit(take(slice(0, 90)), y[:90],
                                               val=(take(slice(90, None)), y[90:]))  # fmt: skip
    assert read.views == ("cls", "tokens")
    f = extract_features(model, take(slice(0, 8)), forward=fwd)
    with torch.no_grad():
        out = model(**take(slice(0, 8)), output_hidden_states=True)
        h = out.hidden_states[-1]  # (B, T, E)
        keep = mask[:8, :, None].float()
        tokens = (h * keep).sum(1) / keep.sum(1)
        pooled = model.bert.pooler(h)
    torch.testing.assert_close(f.logits, out.logits, atol=1e-6, rtol=0)
    torch.testing.assert_close(f.cls, pooled, atol=1e-6, rtol=0)
    torch.testing.assert_close(f.tokens, tokens, atol=1e-6, rtol=0)
    res, score = read.predict_and_score(take(slice(0, 8)))
    assert res.probs.shape == (1, 8, 3) and score.shape == (8,)


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_forward_features_and_head_are_the_forward_pass(pooling):
    torch.manual_seed(0)
    net = TransformerClassifier(3, vocab_size=12, d_model=16, nhead=2, num_layers=2,
                                dim_feedforward=16, pooling=pooling, dropout=0.0).eval()  # fmt: skip
    x = torch.randint(0, 12, (7, 5))
    x[0, 3:] = 0  # padding
    with torch.no_grad():
        cls, tok = net.forward_features(x)
        torch.testing.assert_close(net.forward_head(cls, tok), net(x), atol=1e-5, rtol=0)
        h, pad = net.encode(x)
    if pooling == "mean":
        assert tok is None
        keep = (~pad).float()[..., None]
        torch.testing.assert_close(cls, (h * keep).sum(1) / keep.sum(1))
    else:
        keep = (~pad[:, 1:]).float()[..., None]
        torch.testing.assert_close(tok, (h[:, 1:] * keep).sum(1) / keep.sum(1))
        torch.testing.assert_close(cls, h[:, 0])
    read = DensityRead(net).fit(*_tok(net, 120), val=_tok(net, 60, seed=1))
    assert read.views == (("cls",) if pooling == "mean" else ("cls", "tokens"))
    assert read.predict(torch.randint(1, 12, (4, 5))).probs.shape == (1, 4, 3)


def _tok(net, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, 12, (n, 5), generator=g), torch.arange(n) % 3


def test_vision_transformer_features_read_its_patches():
    torch.manual_seed(0)
    net = VisionTransformer(4, image_size=8, patch_size=4, d_model=8, nhead=2, num_layers=1,
                            dim_feedforward=8).eval()  # fmt: skip
    x = torch.rand(6, 8, 8)
    f = extract_features(net, x, batch_size=4)
    with torch.no_grad():
        torch.testing.assert_close(f.logits, net(x), atol=1e-5, rtol=0)


def test_saved_reads_load_with_weights_only_and_predict_the_same(tmp_path):
    torch.manual_seed(0)
    model = Encoder().eval()
    x, y = _data()
    f_train = extract_features(model, x)
    for read in (_fit_density(model, x, y), GPRead(model, num_features=32).fit(x[:90], y[:90]),
                 TemperatureRead(model).fit(x[:90], y[:90])):  # fmt: skip
        buf = io.BytesIO()
        torch.save(read.state_dict(), buf)
        buf.seek(0)
        state = torch.load(buf, weights_only=True)
        fresh = type(read)().load_state_dict(state)  # no model: reads Features
        q = f_train.rows(torch.arange(10))
        assert torch.equal(fresh.predict(q).probs, read.predict(q).probs)
        assert torch.equal(fresh.score(q), read.score(q))
        assert fresh.kl() == read.kl()
        with pytest.raises(ValueError, match="state_dict"):
            (GPRead() if not isinstance(read, GPRead) else TemperatureRead()).load_state_dict(state)


def test_a_dataloader_fits_the_same_read():
    torch.manual_seed(0)
    model = Encoder().eval()
    x, y = _data()
    loader = lambda a, b: torch.utils.data.DataLoader(  # noqa: E731
        torch.utils.data.TensorDataset(x[a:b], y[a:b]), batch_size=32)
    a = _fit_density(model, x, y)
    b = DensityRead(model).fit(loader(0, 90), val=loader(90, None))
    torch.testing.assert_close(a.score(x[:9]), b.score(x[:9]), atol=1e-6, rtol=1e-6)


def test_gp_read_kl_is_the_closed_form_gaussian_kl():
    from torch.distributions import MultivariateNormal, kl_divergence

    torch.manual_seed(0)
    model = Encoder().double().eval()  # float64 features: the read keeps its covariance in float64
    x, y = _data()
    read = GPRead(model, num_features=16).fit(x[:90], y[:90])
    tril = read.core_.scale_tril
    assert tril.dtype == torch.float64
    q = MultivariateNormal(torch.zeros(16, dtype=torch.float64), scale_tril=tril)
    p = MultivariateNormal(torch.zeros(16, dtype=torch.float64), torch.eye(16, dtype=torch.float64))
    assert read.kl() == pytest.approx(3 * float(kl_divergence(q, p)), rel=1e-6)
    f = extract_features(model, x[:5], tokens=False)
    assert read.predict(f).probs.shape == (1, 5, 3)
    assert read.predict(f, 6, seed=1).probs.shape == (6, 5, 3)
    assert torch.equal(read.predict(f, 6, seed=1).probs, read.predict(f, 6, seed=1).probs)


def test_temperature_read_minimises_the_nll_on_a_grid():
    g = torch.Generator().manual_seed(0)
    z = 4 * torch.randn(300, 3, generator=g)
    y = torch.where(torch.rand(300, generator=g) < 0.3, torch.randint(0, 3, (300,), generator=g),
                    z.argmax(-1))  # fmt: skip
    f = Features(z, torch.randn(300, 2, generator=g))
    read = TemperatureRead().fit(f, y)
    nll = lambda t: float(nn.functional.cross_entropy(z / t, y))  # noqa: E731
    assert nll(read.temperature) <= min(nll(t) for t in torch.linspace(0.5, 8, 151).tolist()) + 1e-9
    assert read.temperature > 1  # overconfident logits are cooled
    assert read.kl() == 0.0


def test_batched_student_t_is_each_class_student_t():
    g = torch.Generator().manual_seed(0)
    C, D, B = 3, 4, 11
    loc = torch.randn(C, D, generator=g, dtype=torch.float64)
    a = torch.randn(C, D, D, generator=g, dtype=torch.float64)
    tril = torch.linalg.cholesky(a @ a.transpose(-1, -2) + torch.eye(D, dtype=torch.float64))
    df = torch.tensor([3.0, 7.5, 40.0], dtype=torch.float64)
    x = torch.randn(B, D, generator=g, dtype=torch.float64)
    got = student_t_log_prob_batched(x, loc, tril, df)
    want = torch.stack([student_t_log_prob(x, loc[c], tril[c], float(df[c])) for c in range(C)], -1)
    torch.testing.assert_close(got, want)
    # a third implementation at one point: the textbook density
    c, b = 1, 2
    cov = tril[c] @ tril[c].T
    d = x[b] - loc[c]
    nu = float(df[c])
    ref = (math.lgamma((nu + D) / 2) - math.lgamma(nu / 2) - D / 2 * math.log(nu * math.pi)
           - 0.5 * float(torch.logdet(cov))
           - (nu + D) / 2 * math.log1p(float(d @ torch.linalg.solve(cov, d)) / nu))  # fmt: skip
    assert float(got[b, c]) == pytest.approx(ref, rel=1e-10)


# ---- input checks ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fitted():
    torch.manual_seed(0)
    model = Encoder().eval()
    x, y = _data()
    return model, x, y, _fit_density(model, x, y), extract_features(model, x[:8])


def test_reads_refuse_bad_features(fitted):
    model, x, y, read, f = fitted
    bad = {
        "mismatched batch": (Features(f.logits, f.cls[:5], f.tokens), ValueError, "features.cls"),
        "wrong classes": (Features(f.logits[:, :2], f.cls, f.tokens), ValueError, r"\(B, 3\)"),
        "nan": (Features(f.logits, f.cls * float("nan"), f.tokens), ValueError, "NaN"),
        "inf logits": (Features(f.logits / 0, f.cls, f.tokens), ValueError, "NaN or Inf"),
        "1-D logits": (Features(f.logits[:, 0], f.cls, f.tokens), ValueError, "2-D"),
        "empty": (Features(f.logits[:0], f.cls[:0], f.tokens[:0]), ValueError, "empty"),
        "int logits": (Features(f.logits.long(), f.cls, f.tokens), TypeError, "floating"),
        "tokens batch": (Features(f.logits, f.cls, f.tokens[:3]), ValueError, "features.tokens"),
        "no tokens": (Features(f.logits, f.cls, None), ValueError, "token view"),
    }
    for feats, err, match in bad.values():
        with pytest.raises(err, match=match):
            read.predict(feats)
        with pytest.raises(err, match=match):
            read.score(feats)


def test_reads_refuse_bad_labels_and_settings(fitted):
    model, x, y, read, f = fitted
    cases = [
        (lambda: DensityRead(model).fit(x[:90], y[:90] + 3, val=(x[90:], y[90:])), ValueError,
         r"\[0, 3\)"),
        (lambda: DensityRead(model).fit(x[:90], y[:90], val=(x[90:], y[90:] - 1)), ValueError,
         r"\[0, 3\)"),
        (lambda: DensityRead(model).fit(x[:90], y[:80], val=(x[90:], y[90:])), ValueError,
         r"\(90,\)"),
        (lambda: DensityRead(model).fit(x[:90], y[:90].float(), val=(x[90:], y[90:])), TypeError,
         "integer"),
        (lambda: DensityRead(model).fit(x[:0], y[:0], val=(x[90:], y[90:])), ValueError, "empty"),
        (lambda: DensityRead(model).fit(x[:90], y[:90]), ValueError, "val="),
        (lambda: DensityRead(model, batch_size=0), ValueError, "batch_size"),
        (lambda: GPRead(model, batch_size=-1), ValueError, "batch_size"),
        (lambda: DensityRead(model, views=("cls", "cls")), ValueError, "views"),
        (lambda: DensityRead(model, strengths="4"), TypeError, "strengths must be a non-empty"),
        (lambda: DensityRead(model, strengths=()), TypeError, "strengths"),
        (lambda: DensityRead(model, strengths=(4.0, -1.0)), ValueError, r"strengths\[1\]"),
        (lambda: DensityRead(model, strengths=(4.0, "8")), TypeError, r"strengths\[1\]"),
        (lambda: DensityRead("model"), TypeError, "nn.Module"),
        (lambda: DensityRead().predict(f), RuntimeError, "not fitted"),
        (lambda: DensityRead().fit(x[:90], y[:90]), TypeError, "no model"),
        (lambda: read.predict(f, num_samples=4), ValueError, "num_samples"),
        (lambda: read.predict(f, num_samples=0), ValueError, "num_samples"),
        (lambda: GPRead(model, outputscales=()), ValueError, "outputscales"),
        (lambda: extract_features(model, x[:4], head="nope"), ValueError, "nope"),
        (lambda: extract_features(nn.Linear(6, 3), x[:4].float()), ValueError, "head="),
    ]
    for call, err, match in cases:
        with pytest.raises(err, match=match):
            call()


def test_the_old_names_warn_and_still_work():
    import importlib

    table = {
        "bayesattn.interop.class_density": ("fit_class_density", "ClassDensityRead"),
        "bayesattn.interop.posthoc_gp": ("fit_posthoc_gp", "PosthocGP"),
        "bayesattn.interop.posthoc_mixture": ("fit_posthoc_mixture", "PosthocMixture"),
        "bayesattn.interop.posthoc": ("fit_posthoc", "PosthocCalibration", "sample_probs"),
        "bayesattn.interop.rank1_hooks": ("rank1_sites", "apply_factors"),
    }
    for mod, names in table.items():
        m = importlib.import_module(mod)
        for name in names:
            with pytest.warns(DeprecationWarning, match="bayesattn.posthoc"):
                obj = getattr(m, name)
            assert callable(obj)
        with pytest.raises(AttributeError, match="no_such_name"):
            m.no_such_name  # noqa: B018
    from bayesattn.interop.class_density import state_views

    net = TransformerClassifier(3, vocab_size=12, d_model=8, nhead=2, num_layers=1,
                                dim_feedforward=8, pooling="cls").eval()  # fmt: skip
    xs = torch.randint(1, 12, (4, 5))
    with pytest.warns(DeprecationWarning, match="extract_features"):
        logits, cls, tok = state_views(net, xs)
    f = extract_features(net, xs)
    assert torch.equal(logits, f.logits) and torch.equal(tok, f.tokens)


def test_wrong_input_errors_name_the_right_call():
    """Each mistake a user makes on their own model is answered with the call that works."""
    torch.manual_seed(0)
    x, y = _data()
    model = Encoder().eval()
    with pytest.raises(ValueError, match=r"val=\(x_val, y_val\)"):
        DensityRead(model).fit(x, y)
    headless = nn.Sequential(nn.Embedding(20, 4), nn.Flatten(), nn.Linear(24, 3))
    with pytest.raises(ValueError, match=r"head=model\[-1\]"):
        DensityRead(headless).fit(x[:90], y[:90], val=(x[90:], y[90:]))
    read = DensityRead(headless, head=headless[-1], views=("cls", "tokens"))
    with pytest.raises(ValueError, match="tokens_layer=") as e:  # no numbered block to find
        read.fit(x[:90], y[:90], val=(x[90:], y[90:]))
    assert "views=('cls',)" in str(e.value)
    ok = DensityRead(headless, head=headless[-1]).fit(x[:90], y[:90], val=(x[90:], y[90:]))
    assert ok.views == ("cls",)
    mean_net = TransformerClassifier(3, vocab_size=20, d_model=16, nhead=2, num_layers=1,
                                     dim_feedforward=16).eval()  # pooling="mean" (default)
    with pytest.raises(ValueError, match="pooling='mean'.*views=\\('cls',\\)"):
        DensityRead(mean_net, views=("cls", "tokens")).fit(x[:90], y[:90], val=(x[90:], y[90:]))


def test_fit_network_density_points_foreign_models_to_density_read_and_reads_mean_pooling():
    from bayesattn.interop.class_density import fit_network_density

    torch.manual_seed(0)
    x, y = _data()
    with pytest.warns(DeprecationWarning), pytest.raises(
        TypeError, match=r"got Encoder: .*bayesattn\.posthoc\.DensityRead\(model\)\.fit"
    ):
        fit_network_density(Encoder().eval(), (x[:90], y[:90]), (x[90:], y[90:]))
    mean_net = TransformerClassifier(3, vocab_size=20, d_model=16, nhead=2, num_layers=1,
                                     dim_feedforward=16).eval()
    with pytest.warns(DeprecationWarning):
        r = fit_network_density(mean_net, (x[:90], y[:90]), (x[90:], y[90:]))
    assert r.read.views == ("cls",)
    f = extract_features(mean_net, x[:5])
    torch.testing.assert_close(r(x[:5])[1], r.read.core_.score([f.cls]))


def test_a_cls_read_skips_the_token_view_and_reads_as_the_read_of_full_features(monkeypatch):
    """views=("cls",) on a network of ours extracts no token view (its last layer computes the
    CLS row only), set at construction, at fit and at load; the read is the one fitted on the
    full features' CLS column."""
    from bayesattn.posthoc import base

    torch.manual_seed(0)
    net = TransformerClassifier(3, vocab_size=12, d_model=16, nhead=2, num_layers=2,
                                dim_feedforward=16, pooling="cls", dropout=0.0).eval()  # fmt: skip
    asked = []
    plain = base.extract_features
    monkeypatch.setattr(base, "extract_features",
                        lambda *a, **k: asked.append(k["tokens"]) or plain(*a, **k))  # fmt: skip
    cls_read = DensityRead(net, views=("cls",)).fit(*_tok(net, 120), val=_tok(net, 60, seed=1))
    assert set(asked) == {False}
    x = torch.randint(1, 12, (9, 5))
    full = plain(net, x)
    assert full.tokens is not None and cls_read.features(x).tokens is None
    res, score = cls_read.predict_and_score(x)
    torch.testing.assert_close(res.probs, cls_read.predict(full).probs)  # the CLS-only pass
    torch.testing.assert_close(score, cls_read.score(full), atol=1e-5, rtol=1e-5)  # float32 pass
    asked.clear()
    DensityRead(net).fit(*_tok(net, 120), val=_tok(net, 60, seed=1))
    assert set(asked) == {True}  # views=None: both where the model gives tokens
    fresh = DensityRead(net).load_state_dict(cls_read.state_dict())
    asked.clear()
    torch.testing.assert_close(fresh.score(x), score)
    assert asked == [False]
