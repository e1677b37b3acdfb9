"""Fuzzing every public entry point: bad input gets a clear error, edge input a finite, correct
answer; never an obscure error from deep inside torch, never a silently wrong result.

Three layers:

* the catalogue (``tests/cross_cutting/fuzz_catalogue.py``): 910 hand-picked bad and edge inputs (161 of them the round-4 cases of issue 33, 113
  the round-5 cases of issue 43),
  one test each;
* hypothesis strategies over shapes, dtypes, masks, non-finite values and hyper-parameters;
* regression tests of each fault the fuzzing found (named after the fix).
"""

from __future__ import annotations

import math
import traceback

import pyro
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import bayesattn as ba
from bayesattn import families as PO
from bayesattn import functional as F
from bayesattn import training as I
from bayesattn.nn import AttentionConfig, attention_mode
from tests.cross_cutting.fuzz_catalogue import CLEAR_ERRORS, _cases, classify

FUZZ = settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

# --------------------------------------------------------------------------------------------
# the catalogue: one test per case
# --------------------------------------------------------------------------------------------

_CASES = {c.name: c for c in _cases()}


@pytest.mark.parametrize("name", sorted(_CASES))
def test_catalogue_case(name):
    outcome, detail = classify(_CASES[name])
    assert outcome in ("clear", "ok"), f"{outcome}: {detail}"


# --------------------------------------------------------------------------------------------
# hypothesis: helpers
# --------------------------------------------------------------------------------------------


def _run(fn):
    """``("ok", result)`` or ``("error", exc)`` for a clear error raised by bayesattn; anything
    else fails the test with the traceback."""
    try:
        return "ok", fn()
    except CLEAR_ERRORS as e:
        last = traceback.extract_tb(e.__traceback__)[-1].filename
        assert "/bayesattn/" in last and "site-packages" not in last, (
            f"{type(e).__name__} from outside bayesattn ({last}): {e}"
        )
        return "error", e


def _finite(t: torch.Tensor) -> bool:
    return bool(torch.isfinite(t).all())


ints = st.one_of(
    st.integers(-2, 6), st.sampled_from([2.0, 2.5, True, None, "2", float("nan")])
)
poison = st.sampled_from([None, float("nan"), float("inf"), float("-inf")])
dtypes = st.sampled_from([torch.float32, torch.float64, torch.float16, torch.bfloat16])
families = st.sampled_from([None, "dirichlet", "logistic_normal", "weibull", "concrete"])


# --------------------------------------------------------------------------------------------
# hypothesis: the attention layer
# --------------------------------------------------------------------------------------------


@FUZZ
@given(
    B=st.integers(1, 3),
    Tq=st.integers(0, 4),
    Tk=st.integers(0, 4),
    H=st.sampled_from([1, 2]),
    family=families,
    dtype=dtypes,
    bad=poison,
    where=st.sampled_from(["query", "key", "value"]),
    mask=st.sampled_from([None, "padding", "float", "causal", "all"]),
    num_samples=st.one_of(st.none(), st.integers(0, 3), st.just(2.0), st.just(True)),
    mode=st.sampled_from([None, "mean", "guide", "model"]),
    batch_first=st.booleans(),
)
def test_attention_layer_fuzz(
    B, Tq, Tk, H, family, dtype, bad, where, mask, num_samples, mode, batch_first
):
    torch.manual_seed(0)
    E = 4 * H
    mha = ba.BayesianMultiheadAttention(E, H, batch_first=batch_first, family=family)
    q, k, v = torch.randn(B, Tq, E), torch.randn(B, Tk, E), torch.randn(B, Tk, E)
    if bad is not None:
        t = {"query": q, "key": k, "value": v}[where]
        if t.numel():
            t.view(-1)[0] = bad
    kpm = attn_mask = None
    is_causal = False
    if mask == "padding":
        kpm = torch.rand(B, Tk) < 0.5
    elif mask == "all":
        kpm = torch.ones(B, Tk, dtype=torch.bool)
    elif mask == "float":
        attn_mask = torch.randn(Tq, Tk).masked_fill(torch.rand(Tq, Tk) < 0.3, float("-inf"))
    elif mask == "causal":
        is_causal = True
    q, k, v = (x.to(dtype) for x in (q, k, v))
    if not batch_first:
        q, k, v = (x.transpose(0, 1) for x in (q, k, v))

    def call():
        with attention_mode(mode):
            return mha(q, k, v, key_padding_mask=kpm, attn_mask=attn_mask, is_causal=is_causal,
                       num_samples=num_samples)

    kind, res = _run(call)
    nonfinite = bad is not None and {"query": Tq, "key": Tk, "value": Tk}[where] > 0
    bad_samples = num_samples is not None and (
        isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1
    )
    if dtype != torch.float32 or nonfinite or bad_samples:
        assert kind == "error", "bad input was accepted"
        return
    if kind == "error":  # the only other refusals: nothing else should fail
        pytest.fail(f"valid input refused: {res}")
    out, w = res
    assert _finite(out) and _finite(w)
    lead = () if num_samples is None else (num_samples,)
    assert out.shape == lead + ((B, Tq, E) if batch_first else (Tq, B, E))
    assert w.shape == lead + (B, Tq, Tk)
    s = w.sum(-1)
    assert bool(((s - 1).abs() < 1e-4).logical_or(s == 0).all()), "rows are not on the simplex"


# --------------------------------------------------------------------------------------------
# hypothesis: functional core and posterior families
# --------------------------------------------------------------------------------------------


@FUZZ
@given(
    shape=st.tuples(st.integers(1, 2), st.integers(1, 2), st.integers(0, 4), st.integers(0, 5)),
    scale=st.sampled_from([1e-3, 1.0, 30.0, 1e4]),
    masked=st.floats(0.0, 1.0),
    bad=poison,
)
def test_posterior_weights_fuzz(shape, scale, masked, bad):
    logits = torch.randn(shape) * scale
    lp = torch.zeros(shape).masked_fill(torch.rand(shape) < masked, float("-inf"))
    if bad is not None and logits.numel():
        logits.view(-1)[0] = bad
    kind, w = _run(lambda: F.posterior_weights(logits, lp))
    if bad is not None and bad != float("-inf") and logits.numel():
        assert kind == "error"
        return
    assert kind == "ok" and _finite(w)
    s = w.sum(-1)
    assert bool(((s - 1).abs() < 1e-5).logical_or(s == 0).all())
    assert bool((w[lp == float("-inf")] == 0).all())


@FUZZ
@given(
    family=families.filter(lambda f: f is not None),
    H=st.sampled_from([1, 2]),
    Tk=st.integers(1, 5),
    scale=st.sampled_from([0.1, 3.0, 100.0, 1e4]),
    masked=st.floats(0.0, 1.0),
    hyper=st.floats(1e-3, 1e3),
    log_shape=st.floats(-12.0, 6.0),
)
def test_posterior_families_fuzz(family, H, Tk, scale, masked, hyper, log_shape):
    torch.manual_seed(0)
    kw = {
        "dirichlet": {"init_concentration": hyper},
        "logistic_normal": {"init_scale": hyper},
        "weibull": {"init_shape": hyper},
        "concrete": {"temperature": hyper},
    }[family]
    kind, fam = _run(lambda: PO.get_family(family, H, 4, **kw))
    if kind == "error":  # only the Weibull shape below its float32-safe bound is refused
        assert family == "weibull" and hyper < PO.WeibullWeights.MIN_SHAPE
        return
    if family == "weibull":
        with torch.no_grad():  # where a large-LR SVI step can drive it
            fam.log_shape.fill_(log_shape)
    logits = torch.randn(2, H, 3, Tk) * scale
    lp = torch.zeros(2, H, 3, Tk).masked_fill(torch.rand(2, H, 3, Tk) < masked, float("-inf"))
    allowed = (logits + lp) > float("-inf")
    q = fam.guide(logits, lp, query=torch.randn(2, H, 3, 4))
    p = fam.model(lp, logits)
    w = fam.to_weights(q.rsample((4,)), allowed)
    assert _finite(w), f"{family}: non-finite weights"
    s = w.sum(-1)
    assert bool(((s - 1).abs() < 1e-4).logical_or(s == 0).all())
    assert bool((w[:, ~allowed] == 0).all())
    kl = fam.kl(q, p, num_samples=2)
    assert _finite(kl) and kl.shape == (2, H, 3)


# --------------------------------------------------------------------------------------------
# hypothesis: networks and configurations
# --------------------------------------------------------------------------------------------


@FUZZ
@given(
    vocab=ints,
    d_model=st.sampled_from([4, 6, 8, 0, 8.0]),
    nhead=st.sampled_from([1, 2, 3, 0]),
    num_layers=ints,
    max_len=ints,
    attention=st.sampled_from([None, "dirichlet", "weibull", 3, AttentionConfig("concrete")]),
    T=st.integers(0, 7),
    B=st.integers(0, 2),
    ids=st.sampled_from(["ok", "neg", "big", "float"]),
)
def test_classifier_fuzz(vocab, d_model, nhead, num_layers, max_len, attention, T, B, ids):
    def build():
        return ba.TransformerClassifier(
            2, vocab_size=vocab, d_model=d_model, nhead=nhead, num_layers=num_layers,
            dim_feedforward=8, max_len=max_len, attention=attention,
        )

    kind, net = _run(build)
    if kind == "error":
        return
    assert isinstance(vocab, int) and vocab >= 1 and isinstance(max_len, int) and max_len >= 1
    x = torch.randint(0, vocab, (B, T))
    if ids == "neg" and x.numel():
        x[0, 0] = -1
    elif ids == "big" and x.numel():
        x[0, 0] = vocab
    elif ids == "float":
        x = x.float()
    kind, logits = _run(lambda: net(x))
    if T == 0 or T > max_len or (ids != "ok" and (x.numel() or ids == "float")):
        assert kind == "error", "bad input was accepted"
        return
    assert kind == "ok", logits
    assert logits.shape == (B, 2) and _finite(logits)


@FUZZ
@given(
    num_layers=st.integers(1, 3),
    layers=st.one_of(
        st.sampled_from(["all", "last", "first", 1]),
        st.lists(st.integers(-4, 4), max_size=3),
    ),
    prior=st.sampled_from(["uniform", "local", "alibi", "learned", "contextual", "nope"]),
    prior_kwargs=st.dictionaries(
        st.sampled_from(["window", "windw", "max_distance", "hidden", "learnable"]),
        st.integers(0, 3),
        max_size=2,
    ),
)
def test_attention_config_fuzz(num_layers, layers, prior, prior_kwargs):
    def build():
        cfg = AttentionConfig("dirichlet", prior=prior, layers=layers, prior_kwargs=prior_kwargs)
        return ba.Encoder(8, 2, num_layers, attention=cfg, dim_feedforward=8)

    kind, enc = _run(build)
    takes = {"uniform": set(), "local": {"window"}, "alibi": {"learnable"},
             "learned": {"max_distance"}, "contextual": {"hidden"}}
    if kind == "error":
        return
    assert prior in takes and set(prior_kwargs) <= takes[prior], "a typo was ignored"
    bayes = [i for i, layer in enumerate(enc.layers) if layer.self_attn.is_bayesian]
    if layers == "all":
        assert bayes == list(range(num_layers))
    elif layers == "last":
        assert bayes == [num_layers - 1]
    else:
        assert isinstance(layers, list)
        assert all(-num_layers <= i < num_layers for i in layers), "out-of-range layer accepted"
        assert bayes == sorted({i % num_layers for i in layers})


@settings(max_examples=6, deadline=None, derandomize=True)
@given(
    lr=st.sampled_from([1e-3, 10.0, 1e6, -1.0, float("nan")]),
    clip=st.sampled_from([None, 1.0]),
    family=st.sampled_from(["dirichlet", "weibull"]),
    method=st.sampled_from(["hybrid", "svi"]),
    blowup=st.booleans(),
)
def test_fit_fuzz(lr, clip, family, method, blowup):
    pyro.clear_param_store()
    torch.manual_seed(0)
    net = ba.TransformerClassifier(2, vocab_size=6, d_model=8, nhead=2, num_layers=1,
                                   dim_feedforward=8, attention=AttentionConfig(family))
    if blowup:
        with torch.no_grad():
            net.head.weight.fill_(1e30)
    x = torch.randint(1, 6, (12, 4))
    y = (x == 3).any(1).long()
    kind, res = _run(lambda: I.fit(net, (x, y), epochs=2, batch_size=4, lr=lr, clip_norm=clip,
                                   method=method, progress=False))
    if not (math.isfinite(lr) and lr > 0):
        assert kind == "error" and isinstance(res, ValueError)
        return
    assert all(_finite(p) for p in net.parameters()), "training left non-finite parameters"
    if kind == "error":
        assert isinstance(res, FloatingPointError) and "training diverged at step" in str(res)
    else:
        assert all(math.isfinite(v) for v in res.train_loss)


# --------------------------------------------------------------------------------------------
# regressions: one test per fault the fuzzing found
# --------------------------------------------------------------------------------------------


def _tiny_net(family="dirichlet"):
    torch.manual_seed(0)
    return ba.TransformerClassifier(2, vocab_size=6, d_model=8, nhead=2, num_layers=1,
                                    dim_feedforward=8, attention=AttentionConfig(family))


def _data():
    g = torch.Generator().manual_seed(1)
    x = torch.randint(1, 6, (12, 4), generator=g)
    return x, (x == 3).any(1).long()


@pytest.mark.parametrize("method", ["hybrid", "svi"])
def test_fit_nan_gradient_stops_with_the_last_good_parameters(method):
    """A NaN gradient at step 2 is not applied: the parameters are bit-identical to those of the
    same run stopped after step 1, and the error says where training diverged."""
    x, y = _data()
    ref = _tiny_net()
    I.fit(ref, (x, y), epochs=1, batch_size=4, max_steps=2, method=method, progress=False)
    pyro.clear_param_store()
    net = _tiny_net()
    calls = []

    def poison(g):
        calls.append(1)
        return torch.full_like(g, float("nan")) if len(calls) == 3 else g

    net.head.weight.register_hook(poison)
    with pytest.raises(FloatingPointError, match=r"training diverged at step 2 .*lower lr"):
        I.fit(net, (x, y), epochs=1, batch_size=4, method=method, progress=False)
    for (n, a), b in zip(ref.named_parameters(), net.parameters(), strict=True):
        assert torch.equal(a, b), n


def test_weibull_shape_is_bounded_and_never_nan():
    with pytest.raises(ValueError, match="init_shape must be >= min_shape"):
        PO.WeibullWeights(2, init_shape=0.01)
    fam = PO.WeibullWeights(2)
    with torch.no_grad():
        fam.log_shape.fill_(-20.0)
    assert torch.equal(fam.shape_k, torch.full((2,), fam.min_shape))
    logits = torch.randn(64, 2, 8, 8) * 5
    q = fam.guide(logits)
    w = fam.to_weights(q.rsample((16,)), None)
    assert _finite(w) and torch.allclose(w.sum(-1), torch.ones(()))
    assert _finite(fam.kl(q, fam.model(None, logits)))


def test_num_samples_gives_a_sample_dim_in_every_mode():
    x = torch.randn(2, 5, 8)
    det = ba.BayesianMultiheadAttention(8, 2, batch_first=True)
    y, w = det(x, x, x, num_samples=3)
    y0, w0 = det(x, x, x)
    assert y.shape == (3, 2, 5, 8) and torch.equal(y[1], y0) and torch.equal(w[2], w0)
    with pytest.raises(TypeError, match="num_samples must be an int"):
        det(x, x, x, num_samples=True)


def test_checkpoint_path_is_checked_before_training_and_stale_tmp_files_go(tmp_path):
    x, y = _data()
    net = _tiny_net()
    before = [p.detach().clone() for p in net.parameters()]
    with pytest.raises(ValueError, match="is a folder"):
        I.fit(net, (x, y), epochs=1, batch_size=4, checkpoint_path=tmp_path, progress=False)
    assert all(torch.equal(a, b) for a, b in zip(before, net.parameters(), strict=True))
    ckpt = tmp_path / "run" / "ckpt.pt"
    ckpt.parent.mkdir()
    stale = ckpt.parent / ".ckpt.pt.abc123.tmp"
    stale.write_bytes(b"half a checkpoint")
    h1 = I.fit(net, (x, y), epochs=1, batch_size=4, checkpoint_path=ckpt, resume="auto",
               progress=False)
    assert not stale.exists() and ckpt.is_file() and len(h1.train_loss) == 1
    # resume="auto" continues from the existing checkpoint
    pyro.clear_param_store()
    h2 = I.fit(_tiny_net(), (x, y), epochs=2, batch_size=4, checkpoint_path=ckpt, resume="auto",
               progress=False)
    assert h2.train_loss[0] == h1.train_loss[0] and len(h2.train_loss) == 2


def test_study_rerun_leaves_only_the_new_runs_files(tmp_path):
    from bayesattn._study_io import INCOMPLETE, begin_run, finish_run, study_status

    out = tmp_path / "study"
    out.mkdir()
    assert study_status(out) == "missing"
    (out / "notes.txt").write_text("the user's, not the study's")
    foreign = begin_run(out)
    assert foreign == {"notes.txt"}
    for f in ("reliability_a.png", "attention_a.nc"):
        (out / f).write_text("x")
    assert study_status(out) == "incomplete" and (out / INCOMPLETE).exists()
    finish_run(out, {"methods": {"a": {}}}, "# report", foreign)
    assert study_status(out) == "complete" and not (out / INCOMPLETE).exists()
    foreign = begin_run(out)  # a rerun (--force) that runs only method b
    assert study_status(out) == "incomplete"
    (out / "reliability_b.png").write_text("y")
    finish_run(out, {"methods": {"b": {}}}, "# report", foreign)
    assert sorted(p.name for p in out.iterdir()) == [
        "notes.txt", "reliability_b.png", "report.md", "results.json"
    ]
    assert study_status(out) == "complete"
    (out / "reliability_b.png").unlink()  # a listed file missing: not complete
    assert study_status(out) == "incomplete"
