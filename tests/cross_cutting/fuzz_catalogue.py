"""A catalogue of bad and edge inputs over every public entry point, and how each one is met.

Every case is a call with an expectation:

``"error"``  bad input: the call must raise a *clear* error (``ValueError``/``TypeError``/
             ``FloatingPointError``/``FileNotFoundError``/a bayesattn error, raised by bayesattn's
             own code, so the message names the argument).
``"ok"``     valid (edge) input: the call must return, every float in the result finite, and the
             case's ``check`` (if any) must hold.
``"either"`` a clear error or a finite, correct result are both fine.

Outcomes: ``clear`` (right kind of error, from bayesattn), ``ok`` (returned as expected),
``obscure`` (an error from deep inside torch/pyro/numpy, or of the wrong kind), ``silent`` (no error
on bad input, a non-finite result, or a failed ``check``: a silently wrong answer).

Run ``python tests/cross_cutting/fuzz_catalogue.py`` for the counts per class and the list of
failures; the test suite (``tests/cross_cutting/test_fuzz.py``) requires 0 obscure and 0 silent.
"""

from __future__ import annotations

import dataclasses
import math
import os
import tempfile
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

CLEAR_ERRORS = (ValueError, TypeError, FloatingPointError, FileNotFoundError, LookupError)


class CleanExit(ValueError):
    """The command line exited non-zero with a message and no traceback."""


@dataclass
class Case:
    name: str
    fn: Callable[[], Any]
    expect: str = "error"  # "error" | "ok" | "either"
    check: Callable[[Any], bool] | None = None
    finite: bool = True  # False: -inf/inf are legitimate in the result (log-priors)


def _finite(x: Any) -> bool:
    if isinstance(x, torch.Tensor):
        if x.device.type == "meta":
            return True  # no values
        return not x.is_floating_point() or bool(torch.isfinite(x).all())
    if isinstance(x, float):
        return math.isfinite(x)
    if isinstance(x, (tuple, list)):
        return all(_finite(v) for v in x)
    if isinstance(x, dict):
        return all(_finite(v) for v in x.values())
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return all(_finite(getattr(x, f.name)) for f in dataclasses.fields(x))
    return True


def _from_bayesattn(e: BaseException) -> bool:
    """The error was raised by bayesattn's own code (its last traceback frame is ours)."""
    tb = traceback.extract_tb(e.__traceback__)
    if not tb:
        return False
    f = tb[-1].filename.replace("\\", "/")
    return "/bayesattn/" in f and "site-packages" not in f


def classify(case: Case) -> tuple[str, str]:
    """``(outcome, detail)`` for one case."""
    try:
        out = case.fn()
    except CLEAR_ERRORS as e:
        if case.expect in ("error", "either") and (_from_bayesattn(e) or isinstance(e, CleanExit)):
            return "clear", f"{type(e).__name__}: {e}"
        where = traceback.extract_tb(e.__traceback__)[-1]
        return "obscure", f"{type(e).__name__} at {where.filename}:{where.lineno}: {e}"
    except Exception as e:  # noqa: BLE001 - any other exception is an obscure failure
        where = traceback.extract_tb(e.__traceback__)[-1]
        return "obscure", f"{type(e).__name__} at {where.filename}:{where.lineno}: {e}"
    if case.expect == "error":
        return "silent", f"no error; returned {type(out).__name__}"
    if case.finite and not _finite(out):
        return "silent", "non-finite values in the result"
    if case.check is not None and not case.check(out):
        return "silent", "result failed its check"
    return "ok", ""


# ------------------------------------------------------------------------------------------------
# the cases
# ------------------------------------------------------------------------------------------------


def _cases() -> list[Case]:  # noqa: C901 - a flat list of cases
    import bayesattn as ba
    from bayesattn import families as PO
    from bayesattn import functional as F
    from bayesattn import priors as P

    cases: list[Case] = []

    def add(name, fn, expect="error", check=None, finite=True):
        cases.append(Case(name, fn, expect, check, finite))

    nan, inf = float("nan"), float("inf")
    bad_ints = {"zero": 0, "neg": -1, "float": 2.5, "bool": True, "str": "3", "nan": nan}

    # ---- functional ----------------------------------------------------------------------------
    q = torch.randn(2, 3, 4)
    k = torch.randn(2, 5, 4)
    v = torch.randn(2, 5, 6)
    add("logits/dim mismatch", lambda: F.attention_logits(q, torch.randn(2, 5, 3)))
    add("logits/scale 0", lambda: F.attention_logits(q, k, 0.0))
    add("logits/scale nan", lambda: F.attention_logits(q, k, nan))
    add("logits/scale str", lambda: F.attention_logits(q, k, "1"))
    add("logits/q list", lambda: F.attention_logits([[1.0]], k))
    add("logits/q 0-d", lambda: F.attention_logits(torch.tensor(1.0), k))
    add("logits/int q", lambda: F.attention_logits(q.long(), k.long()))
    add("logits/dtype mix", lambda: F.attention_logits(q.double(), k))
    add("logits/ok", lambda: F.attention_logits(q, k), "ok")
    add("logits/empty keys", lambda: F.attention_logits(q, torch.randn(2, 0, 4)), "ok")
    for nm, val in bad_ints.items():
        e = "either" if nm == "zero" else "error"
        add(f"causal_log_prior/tgt {nm}", lambda val=val: F.causal_log_prior(val, 3), e,
            finite=False)
        add(f"causal_log_prior/src {nm}", lambda val=val: F.causal_log_prior(3, val), e,
            finite=False)
    add("causal_log_prior/offset float", lambda: F.causal_log_prior(3, 3, offset=0.5))
    add("causal_log_prior/ok", lambda: F.causal_log_prior(3, 4), "ok",
        lambda o: o.shape == (3, 4) and o[0, 1] == -inf, finite=False)
    add("mask/attn_mask int", lambda: F.mask_to_log_prior(
        torch.zeros(3, 5, dtype=torch.int64), batch_size=2, num_heads=1, tgt_len=3, src_len=5))
    add("mask/attn_mask nan", lambda: F.mask_to_log_prior(
        torch.full((3, 5), nan), batch_size=2, num_heads=1, tgt_len=3, src_len=5))
    add("mask/attn_mask shape", lambda: F.mask_to_log_prior(
        torch.zeros(3, 4), batch_size=2, num_heads=1, tgt_len=3, src_len=5))
    add("mask/attn_mask 1-d", lambda: F.mask_to_log_prior(
        torch.zeros(5), batch_size=2, num_heads=1, tgt_len=3, src_len=5))
    add("mask/attn_mask list", lambda: F.mask_to_log_prior(
        [[0.0]], batch_size=2, num_heads=1, tgt_len=3, src_len=5))
    add("mask/kpm shape", lambda: F.mask_to_log_prior(
        None, torch.zeros(2, 4, dtype=torch.bool), batch_size=2, num_heads=1, tgt_len=3,
        src_len=5))
    add("mask/kpm int", lambda: F.mask_to_log_prior(
        None, torch.zeros(2, 5, dtype=torch.int64), batch_size=2, num_heads=1, tgt_len=3,
        src_len=5))
    add("mask/batch_size neg", lambda: F.mask_to_log_prior(
        torch.zeros(3, 5), batch_size=-1, num_heads=1, tgt_len=3, src_len=5), "either")
    add("mask/causal ok", lambda: F.mask_to_log_prior(
        None, None, True, batch_size=2, num_heads=1, tgt_len=3, src_len=5), "ok", finite=False)
    add("posterior_weights/nan logits", lambda: F.posterior_weights(torch.full((2, 3), nan)))
    add("posterior_weights/nan prior", lambda: F.posterior_weights(
        torch.zeros(2, 3), torch.full((2, 3), nan)))
    add("posterior_weights/all masked", lambda: F.posterior_weights(
        torch.zeros(2, 3), torch.full((2, 3), -inf)), "ok", lambda o: bool((o == 0).all()))
    add("posterior_weights/list", lambda: F.posterior_weights([1.0, 2.0]))
    add("posterior_weights/0-d", lambda: F.posterior_weights(torch.tensor(1.0)))
    add("posterior_weights/int", lambda: F.posterior_weights(torch.zeros(2, 3, dtype=torch.long)))
    add("log_posterior_weights/nan", lambda: F.log_posterior_weights(torch.full((2, 3), nan)))
    add("attend/shape", lambda: F.attend(torch.rand(2, 3, 5), torch.randn(2, 4, 6)))
    add("attend/dtype", lambda: F.attend(torch.rand(2, 3, 5), torch.randn(2, 5, 6).double()))
    add("attend/list", lambda: F.attend([[1.0]], v))
    add("attention/dropout 1", lambda: F.attention(q, k, v, dropout_p=1.0))
    add("attention/dropout str", lambda: F.attention(q, k, v, dropout_p="0.1"))
    add("attention/nan q", lambda: F.attention(torch.full_like(q, nan), k, v))
    add("attention/v keys", lambda: F.attention(q, k, torch.randn(2, 4, 6)))
    add("attention/ok", lambda: F.attention(q, k, v), "ok")
    add("attention/no keys", lambda: F.attention(q, k[:, :0], v[:, :0]), "either",
        lambda o: bool((o[0] == 0).all()))
    add("entropy/list", lambda: F.entropy([0.5, 0.5]))
    add("entropy/int", lambda: F.entropy(torch.ones(3, dtype=torch.long)))
    add("entropy/neg", lambda: F.entropy(torch.tensor([-0.5, 1.5])))
    add("check_finite/nan", lambda: F.check_finite("x", torch.tensor([nan])))

    # ---- priors --------------------------------------------------------------------------------
    qh, kh = torch.randn(2, 2, 3, 4), torch.randn(2, 2, 5, 4)
    for nm, val in bad_ints.items():
        add(f"LocalWindowPrior/window {nm}", lambda val=val: P.LocalWindowPrior(val),
            "either" if nm == "zero" else "error")
        add(f"LearnedPrior/heads {nm}", lambda val=val: P.LearnedPrior(val, 2))
        add(f"LearnedPrior/dist {nm}", lambda val=val: P.LearnedPrior(2, val),
            "either" if nm == "zero" else "error")
        add(f"DistanceDecayPrior/heads {nm}", lambda val=val: P.DistanceDecayPrior(val))
        add(f"ContextualPrior/head_dim {nm}", lambda val=val: P.ContextualPrior(val))
        add(f"ContextualPrior/hidden {nm}", lambda val=val: P.ContextualPrior(4, val))
        add(f"alibi_slopes/{nm}", lambda val=val: P.alibi_slopes(val))
    add("LocalWindowPrior/causal str", lambda: P.LocalWindowPrior(2, causal="no"))
    add("DistanceDecayPrior/slopes shape", lambda: P.DistanceDecayPrior(2, slopes=[1.0]))
    add("DistanceDecayPrior/slopes nan", lambda: P.DistanceDecayPrior(2, slopes=[1.0, nan]))
    add("DistanceDecayPrior/slopes neg", lambda: P.DistanceDecayPrior(2, slopes=[1.0, -1.0]))
    add("DistanceDecayPrior/slopes str", lambda: P.DistanceDecayPrior(2, slopes="ab"))
    add("prior/3-d q", lambda: P.CausalPrior()(qh[0], kh[0]))
    add("prior/list q", lambda: P.CausalPrior()([1.0], kh))
    add("prior/q_pos shape", lambda: P.CausalPrior()(qh, kh, q_pos=torch.arange(4)))
    add("prior/q_pos float", lambda: P.CausalPrior()(qh, kh, q_pos=torch.rand(3)), "either",
        finite=False)
    add("prior/q_pos list", lambda: P.CausalPrior()(qh, kh, q_pos=[0, 1, 2]))
    add("LearnedPrior/heads mismatch", lambda: P.LearnedPrior(3, 2)(qh, kh))
    add("DistanceDecayPrior/heads mismatch", lambda: P.DistanceDecayPrior(3)(qh, kh))
    add("ContextualPrior/dim mismatch", lambda: P.ContextualPrior(3)(qh, kh))
    add("ContextualPrior/nan keys", lambda: P.ContextualPrior(4)(qh, torch.full_like(kh, nan)))
    add("SumPrior/empty", lambda: P.SumPrior())
    add("SumPrior/bad term", lambda: P.SumPrior(P.CausalPrior(), 3))
    add("priors/ok", lambda: (P.CausalPrior() + P.DistanceDecayPrior(2) + P.LearnedPrior(2, 2)
                              + P.LocalWindowPrior(1) + P.ContextualPrior(4))(qh, kh), "ok",
        finite=False)

    # ---- posteriors ----------------------------------------------------------------------------
    fams = {
        "dirichlet": PO.DirichletWeights,
        "logistic_normal": PO.LogisticNormalWeights,
        "weibull": PO.WeibullWeights,
        "concrete": PO.ConcreteWeights,
    }
    logits = torch.randn(2, 2, 3, 5)
    for fname, cls in fams.items():
        for nm, val in bad_ints.items():
            add(f"{fname}/num_heads {nm}", lambda cls=cls, val=val: cls(val))
        add(f"{fname}/nan logits", lambda cls=cls: cls(2).guide(torch.full_like(logits, nan)))
        add(f"{fname}/+inf logits", lambda cls=cls: cls(2).guide(torch.full_like(logits, inf)))
        add(f"{fname}/3-d logits", lambda cls=cls: cls(2).guide(logits[0]).rsample(), "either")
        add(f"{fname}/list logits", lambda cls=cls: cls(2).guide([[1.0]]))
        add(f"{fname}/int logits", lambda cls=cls: cls(2).guide(logits.long()))
        add(f"{fname}/prior mask shape", lambda cls=cls: cls(2).guide(
            logits, torch.zeros(2, 2, 3, 4)))
        add(f"{fname}/kl Tk mismatch", lambda cls=cls: cls(2).kl(
            cls(2).guide(logits), cls(2).model(None, torch.zeros(2, 2, 3, 4))))
        add(f"{fname}/kl ok", lambda cls=cls: cls(2).kl(
            cls(2).guide(logits), cls(2).model(None, logits)), "ok")

        def weights_ok(cls=cls):
            fam = cls(2)
            lp = torch.zeros(2, 2, 3, 5)
            lp[..., -2:] = -inf
            d = fam.guide(logits, lp, query=torch.randn(2, 2, 3, 4))
            w = fam.to_weights(d.rsample(), (logits + lp) > -inf)
            return w

        add(f"{fname}/masked weights", weights_ok, "ok",
            lambda w: bool(torch.allclose(w.sum(-1), torch.ones(())) and (w[..., -2:] == 0).all()))
        add(f"{fname}/num_heads mismatch", lambda cls=cls: cls(3).guide(logits))
    add("dirichlet/init_concentration 0", lambda: PO.DirichletWeights(2, init_concentration=0.0))
    add("dirichlet/model_concentration nan", lambda: PO.DirichletWeights(2, model_concentration=nan))
    add("logistic_normal/init_scale -1", lambda: PO.LogisticNormalWeights(2, init_scale=-1.0))
    add("logistic_normal/input_dependent no dim",
        lambda: PO.LogisticNormalWeights(2, input_dependent=True))
    add("logistic_normal/input_dependent no query",
        lambda: PO.LogisticNormalWeights(2, input_dependent=True, head_dim=4).guide(logits))
    add("weibull/init_shape 0", lambda: PO.WeibullWeights(2, init_shape=0.0))
    add("concrete/temperature inf", lambda: PO.ConcreteWeights(2, temperature=inf))

    def weibull_small(shape):
        torch.manual_seed(0)
        fam = PO.WeibullWeights(2, init_shape=shape)
        d = fam.guide(logits * 3)
        return fam.to_weights(d.rsample((64,)), None)

    for shape in (0.01, 0.05, 0.2):
        add(f"weibull/small shape {shape}", lambda s=shape: weibull_small(s), "either",
            lambda w: bool(torch.allclose(w.sum(-1), torch.ones(()))))

    def weibull_driven():
        fam = PO.WeibullWeights(2)
        with torch.no_grad():
            fam.log_shape.fill_(-8.0)  # what one SVI step at a large LR did
        d = fam.guide(logits * 3)
        return fam.to_weights(d.rsample((64,)), None), fam.kl(d, fam.model(None, logits))

    add("weibull/shape driven small", weibull_driven, "ok")
    add("get_family/unknown", lambda: PO.get_family("gauss", 2))
    add("get_family/typo kwarg", lambda: PO.get_family("dirichlet", 2, init_conc=3.0))
    add("get_family/non-str", lambda: PO.get_family(3, 2))

    # ---- BayesianMultiheadAttention -------------------------------------------------------------
    MHA = ba.BayesianMultiheadAttention
    x = torch.randn(2, 5, 8)
    for nm, val in bad_ints.items():
        add(f"MHA/embed_dim {nm}", lambda val=val: MHA(val, 2))
        add(f"MHA/num_heads {nm}", lambda val=val: MHA(8, val))
    add("MHA/embed not divisible", lambda: MHA(8, 3))
    add("MHA/dropout 1", lambda: MHA(8, 2, dropout=1.0))
    add("MHA/dropout nan", lambda: MHA(8, 2, dropout=nan))
    add("MHA/kdim 0", lambda: MHA(8, 2, kdim=0))
    add("MHA/kdim float", lambda: MHA(8, 2, kdim=2.5))
    add("MHA/prior str", lambda: MHA(8, 2, prior="causal"), "either")
    add("MHA/family typo", lambda: MHA(8, 2, family="dirichlett"))
    add("MHA/family int", lambda: MHA(8, 2, family=3))
    add("MHA/family heads", lambda: MHA(8, 2, family=PO.DirichletWeights(3)))
    add("MHA/batch_first str", lambda: MHA(8, 2, batch_first="yes"), "either")
    mha = MHA(8, 2, batch_first=True)
    bmha = MHA(8, 2, batch_first=True, family="dirichlet")
    for dt in (torch.float16, torch.bfloat16, torch.float64):
        add(f"MHA/query {dt}", lambda dt=dt: mha(x.to(dt), x.to(dt), x.to(dt)), "either")
        add(f"MHA/bayes query {dt}", lambda dt=dt: bmha(x.to(dt), x.to(dt), x.to(dt)), "either")
    add("MHA/query int", lambda: mha(x.long(), x.long(), x.long()))
    add("MHA/query 0-d", lambda: mha(torch.tensor(1.0), torch.tensor(1.0), torch.tensor(1.0)))
    add("MHA/query 1-d", lambda: mha(torch.randn(8), torch.randn(8), torch.randn(8)))
    add("MHA/query list", lambda: mha([[1.0] * 8], x, x))
    add("MHA/last dim", lambda: mha(x[..., :4], x, x))
    add("MHA/batch mismatch", lambda: mha(x, x[:1], x[:1]))
    add("MHA/kv mismatch", lambda: mha(x, x, x[:, :4]))
    add("MHA/nan query", lambda: mha(torch.full_like(x, nan), x, x))
    add("MHA/inf key", lambda: mha(x, torch.full_like(x, inf), x))
    add("MHA/nan value", lambda: bmha(x, x, torch.full_like(x, nan)))
    add("MHA/kpm shape", lambda: mha(x, x, x, key_padding_mask=torch.zeros(2, 4, dtype=torch.bool)))
    add("MHA/kpm list", lambda: mha(x, x, x, key_padding_mask=[[False] * 5] * 2))
    add("MHA/attn_mask shape", lambda: mha(x, x, x, attn_mask=torch.zeros(4, 5)))
    add("MHA/attn_mask int", lambda: mha(x, x, x, attn_mask=torch.zeros(5, 5, dtype=torch.int32)))
    add("MHA/attn_mask nan", lambda: mha(x, x, x, attn_mask=torch.full((5, 5), nan)))
    add("MHA/all masked", lambda: mha(x, x, x, key_padding_mask=torch.ones(2, 5, dtype=torch.bool)),
        "ok", lambda o: bool((o[0] == mha.out_proj.bias).all()))
    add("MHA/bayes all masked", lambda: bmha(
        x, x, x, key_padding_mask=torch.ones(2, 5, dtype=torch.bool)), "ok")
    for nm, val in bad_ints.items():
        add(f"MHA/num_samples {nm}", lambda val=val: bmha(x, x, x, num_samples=val))
    add("MHA/num_samples deterministic", lambda: mha(x, x, x, num_samples=4), "either",
        lambda o: o[0].shape == (4, 2, 5, 8) and o[1].shape == (4, 2, 5, 5))
    add("MHA/num_samples mean mode", lambda: _in_mode("mean", lambda: bmha(x, x, x, num_samples=4)),
        "either", lambda o: o[0].shape == (4, 2, 5, 8))
    add("MHA/num_samples ok", lambda: bmha(x, x, x, num_samples=4), "ok",
        lambda o: o[0].shape == (4, 2, 5, 8) and o[1].shape == (4, 2, 5, 5))
    add("MHA/zero-length query", lambda: mha(x[:, :0], x, x), "either",
        lambda o: o[0].shape == (2, 0, 8))
    add("MHA/zero-length key", lambda: mha(x, x[:, :0], x[:, :0]), "either",
        lambda o: bool((o[0] == mha.out_proj.bias).all()))
    add("MHA/bayes zero-length key", lambda: bmha(x, x[:, :0], x[:, :0]), "either")
    add("MHA/empty batch", lambda: bmha(x[:0], x[:0], x[:0]), "either")
    # torch's rule (issue 9): the is_causal hint needs its mask; torch's RuntimeError message, and
    # a ValueError too
    add("MHA/is_causal without attn_mask", lambda: bmha(x, x, x, is_causal=True))
    add("MHA/q_pos wrong", lambda: MHA(8, 2, batch_first=True, prior=P.CausalPrior())(
        x, x, x, q_pos=torch.arange(3)))
    add("MHA/q_pos list", lambda: MHA(8, 2, batch_first=True, prior=P.CausalPrior())(
        x, x, x, q_pos=[0, 1, 2, 3, 4]))

    # ---- AttentionConfig, blocks ---------------------------------------------------------------
    AC = ba.AttentionConfig
    add("AttentionConfig/layers out of range",
        lambda: ba.TransformerClassifier(2, vocab_size=5, d_model=8, nhead=2, num_layers=1,
                                         attention=AC("dirichlet", layers=[5])))
    add("AttentionConfig/layers negative",
        lambda: ba.TransformerClassifier(2, vocab_size=5, d_model=8, nhead=2, num_layers=2,
                                         attention=AC("dirichlet", layers=[-1])), "either",
        lambda net: net.bayesian_layers == ["encoder.layers.1.self_attn"])
    add("AttentionConfig/layers int", lambda: AC("dirichlet", layers=1))
    add("AttentionConfig/layers str item", lambda: AC("dirichlet", layers=["0"]))
    add("AttentionConfig/layers bad str", lambda: AC("dirichlet", layers="first"))
    add("AttentionConfig/prior_kwargs typo", lambda: AC("dirichlet", prior="local",
                                                        prior_kwargs={"windw": 2}))
    add("AttentionConfig/prior_kwargs uniform", lambda: AC(prior="uniform",
                                                           prior_kwargs={"window": 2}))
    add("AttentionConfig/prior_kwargs bad value", lambda: AC(prior="local",
                                                             prior_kwargs={"window": -2}))
    add("AttentionConfig/family_kwargs typo",
        lambda: AC("dirichlet", family_kwargs={"init_conc": 2.0}))
    add("AttentionConfig/family_kwargs bad value",
        lambda: AC("dirichlet", family_kwargs={"init_concentration": -2.0}))
    add("AttentionConfig/family unknown", lambda: AC("gauss"))
    add("AttentionConfig/family int", lambda: AC(3))
    add("AttentionConfig/prior unknown", lambda: AC(prior="alibi2"))
    add("AttentionConfig/prior int", lambda: AC(prior=3))
    add("AttentionConfig/which str", lambda: AC("dirichlet", which="self"), "either",
        lambda c: tuple(c.which) == ("self",))
    add("AttentionConfig/which bad", lambda: AC("dirichlet", which=("selff",)))
    add("AttentionConfig/family_kwargs list", lambda: AC("dirichlet", family_kwargs=[1]))
    for nm, val in bad_ints.items():
        add(f"EncoderLayer/d_model {nm}", lambda val=val: ba.EncoderLayer(val, 2))
        add(f"EncoderLayer/nhead {nm}", lambda val=val: ba.EncoderLayer(8, val))
        add(f"EncoderLayer/ff {nm}", lambda val=val: ba.EncoderLayer(8, 2, val))
        add(f"Encoder/num_layers {nm}", lambda val=val: ba.Encoder(8, 2, val))
        add(f"Decoder/num_layers {nm}", lambda val=val: ba.Decoder(8, 2, val))
    add("EncoderLayer/not divisible", lambda: ba.EncoderLayer(8, 3))
    add("EncoderLayer/dropout nan", lambda: ba.EncoderLayer(8, 2, 16, dropout=nan))
    add("EncoderLayer/activation", lambda: ba.EncoderLayer(8, 2, 16, activation="tanh"))
    add("DecoderLayer/not divisible", lambda: ba.DecoderLayer(8, 3))
    add("Encoder/attention str", lambda: ba.Encoder(8, 2, 1, attention="dirichlet"), "either",
        lambda e: e.layers[0].self_attn.is_bayesian)
    add("Encoder/attention int", lambda: ba.Encoder(8, 2, 1, attention=3))
    add("Encoder/bad kwarg", lambda: ba.Encoder(8, 2, 1, dim_ff=3))
    enc = ba.Encoder(8, 2, 1, dim_feedforward=16)
    add("Encoder/2-d input", lambda: enc(torch.randn(5, 8)), "either")
    add("Encoder/last dim", lambda: enc(torch.randn(2, 5, 7)))
    add("Encoder/float64", lambda: enc(torch.randn(2, 5, 8).double()), "either")
    add("Encoder/nan", lambda: enc(torch.full((2, 5, 8), nan)))
    add("Encoder/zero-length", lambda: enc(torch.randn(2, 0, 8)), "either",
        lambda o: o.shape == (2, 0, 8))
    dec = ba.Decoder(8, 2, 1, dim_feedforward=16)
    add("Decoder/no memory", lambda: dec(torch.randn(2, 5, 8)))
    add("Decoder/memory dim", lambda: dec(torch.randn(2, 5, 8), torch.randn(2, 3, 7)))
    add("Decoder/memory batch", lambda: dec(torch.randn(2, 5, 8), torch.randn(3, 3, 8)))
    add("Decoder/zero-length memory", lambda: dec(torch.randn(2, 5, 8), torch.randn(2, 0, 8)),
        "either")

    # ---- networks --------------------------------------------------------------------------------
    TC = ba.TransformerClassifier
    small = dict(d_model=8, nhead=2, num_layers=1, dim_feedforward=16)
    for nm, val in bad_ints.items():
        add(f"TC/vocab_size {nm}", lambda val=val: TC(2, vocab_size=val, **small))
        add(f"TC/num_classes {nm}", lambda val=val: TC(val, vocab_size=5, **small))
        add(f"TC/max_len {nm}", lambda val=val: TC(2, vocab_size=5, max_len=val, **small))
        add(f"TC/input_dim {nm}", lambda val=val: TC(2, input_dim=val, **small))
        add(f"CausalLM/vocab_size {nm}", lambda val=val: ba.CausalLM(val, **small))
        add(f"Seq2Seq/src_vocab {nm}", lambda val=val: ba.Seq2Seq(val, 6, d_model=8, nhead=2))
        add(f"CausalLM/max_len {nm}", lambda val=val: ba.CausalLM(6, max_len=val, **small))
    add("TC/d_model % nhead", lambda: TC(2, vocab_size=5, d_model=10, nhead=4))
    add("TC/dropout 1", lambda: TC(2, vocab_size=5, dropout=1.0, **small))
    add("TC/pooling", lambda: TC(2, vocab_size=5, pooling="max", **small))
    add("TC/both inputs", lambda: TC(2, vocab_size=5, input_dim=3, **small))
    add("TC/neither input", lambda: TC(2, **small))
    add("TC/attention str", lambda: TC(2, vocab_size=5, attention="dirichlet", **small), "either",
        lambda net: len(net.bayesian_layers) == 1)
    add("TC/attention dict", lambda: TC(2, vocab_size=5, attention={"family": "x"}, **small))
    add("TC/pad_id out of vocab", lambda: TC(2, vocab_size=5, pad_id=7, **small), "either")
    add("CausalLM/bos out of vocab", lambda: ba.CausalLM(3, bos_id=5, **small))
    add("Seq2Seq/eos out of vocab", lambda: ba.Seq2Seq(6, 6, d_model=8, nhead=2, eos_id=9))
    add("VisionTransformer/patch", lambda: ba.VisionTransformer(10, image_size=8, patch_size=3))
    add("VisionTransformer/patch 0", lambda: ba.VisionTransformer(10, image_size=8, patch_size=0))
    add("VisionTransformer/patch float",
        lambda: ba.VisionTransformer(10, image_size=8, patch_size=2.0))
    tc = TC(2, vocab_size=6, **small)
    btc = TC(2, vocab_size=6, attention=AC("dirichlet"), **small)
    xt = torch.randint(1, 6, (3, 4))
    yt = torch.tensor([0, 1, 0])
    add("TC/zero-length", lambda: tc(torch.zeros(3, 0, dtype=torch.long)))
    add("TC/zero-length bayes", lambda: btc(torch.zeros(3, 0, dtype=torch.long)))
    add("TC/all padding", lambda: tc(torch.zeros(3, 4, dtype=torch.long)), "either")
    add("TC/ids out of range", lambda: tc(torch.full((3, 4), 9)))
    add("TC/negative ids", lambda: tc(torch.full((3, 4), -1)))
    add("TC/float ids", lambda: tc(xt.float()))
    add("TC/1-d ids", lambda: tc(xt[0]))
    add("TC/too long", lambda: tc(torch.randint(1, 6, (2, 600))))
    add("TC/list", lambda: tc([[1, 2]]))
    add("TC/y shape", lambda: btc.model(xt, yt[:2]))
    add("TC/y range", lambda: btc.model(xt, torch.tensor([0, 1, 5])))
    add("TC/y float", lambda: btc.model(xt, yt.float()))
    add("TC/y list", lambda: btc.model(xt, [0, 1, 0]))
    add("TC/num_data small", lambda: btc.model(xt, yt, num_data=2))
    add("TC/num_data float", lambda: btc.model(xt, yt, num_data=5.0))
    add("TC/elbo num_particles float", lambda: btc.elbo_loss(xt, yt, num_particles=2.0))
    add("TC/elbo num_particles 0", lambda: btc.elbo_loss(xt, yt, num_particles=0))
    add("TC/elbo num_particles bool", lambda: btc.elbo_loss(xt, yt, num_particles=True))
    add("TC/elbo beta nan", lambda: btc.elbo_loss(xt, yt, beta=nan))
    add("TC/elbo beta neg", lambda: btc.elbo_loss(xt, yt, beta=-1.0))
    add("TC/elbo no y", lambda: btc.elbo_loss(xt, None))
    add("TC/forward num_samples float", lambda: btc(xt, num_samples=2.0))
    add("TC/forward num_samples 0", lambda: btc(xt, num_samples=0))
    add("TC/elbo ok", lambda: btc.elbo_loss(xt, yt, num_particles=3), "ok")
    vtc = TC(2, input_dim=3, **small)
    add("TC/vectors float64", lambda: vtc(torch.randn(2, 4, 3).double()), "either")
    add("TC/vectors float16", lambda: vtc(torch.randn(2, 4, 3).half()), "either")
    add("TC/vectors nan", lambda: vtc(torch.full((2, 4, 3), nan)))
    add("TC/vectors zero-length", lambda: vtc(torch.randn(2, 0, 3)))
    add("TC/vectors int", lambda: vtc(torch.ones(2, 4, 3, dtype=torch.long)))
    vit = ba.VisionTransformer(10, **small)
    add("ViT/wrong size", lambda: vit(torch.randn(2, 6, 6)))
    add("ViT/int images", lambda: vit(torch.ones(2, 8, 8, dtype=torch.long)))
    add("ViT/float64", lambda: vit(torch.randn(2, 8, 8).double()), "either")
    add("ViT/nan", lambda: vit(torch.full((2, 8, 8), nan)))
    add("ViT/list", lambda: vit([[0.0]]))
    lm = ba.CausalLM(6, **small)
    add("CausalLM/one token", lambda: lm(torch.ones(2, 1, dtype=torch.long)))
    add("CausalLM/zero-length", lambda: lm(torch.ones(2, 0, dtype=torch.long)))
    add("CausalLM/generate zero-length prompt",
        lambda: lm.generate(torch.ones(2, 0, dtype=torch.long), 3))
    add("CausalLM/generate max_len float", lambda: lm.generate(torch.ones(2, 1, dtype=torch.long),
                                                                2.5))
    add("CausalLM/generate max_len bool", lambda: lm.generate(torch.ones(2, 1, dtype=torch.long),
                                                               True))
    add("CausalLM/generate num_samples float",
        lambda: lm.generate(torch.ones(2, 1, dtype=torch.long), 3, num_samples=2.0))
    add("CausalLM/generate num_samples 0",
        lambda: lm.generate(torch.ones(2, 1, dtype=torch.long), 3, num_samples=0))
    add("CausalLM/generate mode", lambda: lm.generate(torch.ones(2, 1, dtype=torch.long), 3,
                                                      mode="sample"))
    add("CausalLM/generate too long", lambda: lm.generate(torch.ones(2, 1, dtype=torch.long),
                                                          500), "either")
    add("CausalLM/generate ok", lambda: lm.generate(torch.ones(2, 1, dtype=torch.long), 3), "ok")
    s2s = ba.Seq2Seq(6, 7, d_model=8, nhead=2, num_encoder_layers=1, num_decoder_layers=1)
    src = torch.randint(3, 6, (2, 4))
    tgt = torch.tensor([[1, 3, 4, 2], [1, 5, 2, 0]])
    add("Seq2Seq/no tgt", lambda: s2s(src))
    add("Seq2Seq/tgt 1 token", lambda: s2s(src, tgt[:, :1]))
    add("Seq2Seq/src zero-length", lambda: s2s(src[:, :0], tgt))
    add("Seq2Seq/generate zero-length", lambda: s2s.generate(src[:, :0], 3))
    add("Seq2Seq/generate all padding", lambda: s2s.generate(torch.zeros(2, 4, dtype=torch.long),
                                                             3), "either")
    add("Seq2Seq/tgt batch", lambda: s2s(src, tgt[:1]))
    add("Seq2Seq/ok", lambda: s2s(src, tgt), "ok")
    add("Seq2Seq/generate ok", lambda: s2s.generate(src, 3, num_samples=2), "ok")
    add("bayesian_projections/bad target", lambda: ba.bayesian_projections(
        TC(2, vocab_size=5, **small), targets=("*nothing*",)))
    add("bayesian_projections/non network", lambda: ba.bayesian_projections(torch.nn.Linear(2, 2)))
    add("bayesian_projections/prior_scale str", lambda: ba.bayesian_projections(
        TC(2, vocab_size=5, **small), prior_scale="1"))
    add("bayesian_projections/targets str", lambda: ba.bayesian_projections(
        TC(2, vocab_size=5, **small), targets="*in_proj_weight"), "either")
    add("attention_mode/bad", lambda: _in_mode("sample", lambda: None))

    # ---- inference --------------------------------------------------------------------------------
    from bayesattn import training as I

    add("TrainConfig/lr -1", lambda: I.TrainConfig(lr=-1.0))
    add("TrainConfig/epochs 0", lambda: I.TrainConfig(epochs=0))
    add("TrainConfig/batch float", lambda: I.TrainConfig(batch_size=2.5))
    add("TrainConfig/method", lambda: I.TrainConfig(method="adam"))
    add("TrainConfig/device", lambda: I.TrainConfig(device="gpu9"))
    add("fit/unknown option", lambda: I.fit(btc, (xt, yt), epochs=1, lrr=1.0))
    add("fit/data list", lambda: I.fit(btc, [xt], epochs=1, progress=False))
    add("fit/data dict", lambda: I.fit(btc, {"x": xt}, epochs=1, progress=False))
    add("fit/len mismatch", lambda: I.fit(btc, (xt, yt[:2]), epochs=1, progress=False))
    add("fit/empty", lambda: I.fit(btc, (xt[:0], yt[:0]), epochs=1, progress=False))
    add("fit/network not ours", lambda: I.fit(torch.nn.Linear(2, 2), (xt, yt), epochs=1))
    add("fit/resume no path", lambda: I.fit(btc, (xt, yt), resume=True, progress=False))
    add("fit/resume missing", lambda: I.fit(btc, (xt, yt), resume=True, progress=False,
                                            checkpoint_path="/nonexistent/x.pt"))
    add("fit/resume str", lambda: I.fit(btc, (xt, yt), resume="yes", progress=False,
                                        checkpoint_path="/nonexistent/x.pt"))
    tmpdir = tempfile.mkdtemp(prefix="bayesattn-fuzz-")

    def fit_dir():
        return I.fit(TC(2, vocab_size=6, **small), (xt, yt), epochs=1, progress=False,
                     checkpoint_path=tmpdir, max_steps=None)

    add("fit/checkpoint is dir", fit_dir)

    def fit_under_file():
        f = Path(tmpdir) / "afile"
        f.write_text("x")
        return I.fit(TC(2, vocab_size=6, **small), (xt, yt), epochs=1, progress=False,
                     checkpoint_path=f / "ckpt.pt")

    add("fit/checkpoint under a file", fit_under_file)

    def fit_diverge():
        net = TC(2, vocab_size=6, attention=AC("weibull"), **small)
        with torch.no_grad():
            net.head.weight.fill_(1e30)
        try:
            I.fit(net, (xt, yt), epochs=3, batch_size=3, lr=1e3, progress=False)
        except FloatingPointError as e:
            finite = all(bool(torch.isfinite(p).all()) for p in net.parameters())
            if "diverged at step" not in str(e) or not finite:
                raise RuntimeError(f"diverged, but: {e}; params finite: {finite}") from e
            raise
        return net

    add("fit/diverges", fit_diverge, "either")

    def fit_nan_grad():
        net = TC(2, vocab_size=6, attention=AC("dirichlet"), **small)
        h = net.head.weight.register_hook(lambda g: torch.full_like(g, nan))
        try:
            I.fit(net, (xt, yt), epochs=1, batch_size=3, progress=False)
        except FloatingPointError as e:
            finite = all(bool(torch.isfinite(p).all()) for p in net.parameters())
            if "diverged at step 0" not in str(e) or not finite:
                raise RuntimeError(f"diverged, but: {e}; params finite: {finite}") from e
            raise
        finally:
            h.remove()
        return list(net.parameters())

    add("fit/nan gradient", fit_nan_grad)

    def fit_nan_grad_svi():
        net = TC(2, vocab_size=6, attention=AC("dirichlet"), **small)
        h = net.head.weight.register_hook(lambda g: torch.full_like(g, nan))
        try:
            I.fit(net, (xt, yt), epochs=1, batch_size=3, progress=False, method="svi")
        except FloatingPointError as e:
            finite = all(bool(torch.isfinite(p).all()) for p in net.parameters())
            if "diverged at step 0" not in str(e) or not finite:
                raise RuntimeError(f"diverged, but: {e}; params finite: {finite}") from e
            raise
        finally:
            h.remove()
        return list(net.parameters())

    add("fit/nan gradient svi", fit_nan_grad_svi)
    add("load_checkpoint/missing", lambda: I.load_checkpoint(Path(tmpdir) / "nope.pt"))
    add("load_checkpoint/dir", lambda: I.load_checkpoint(tmpdir))

    def garbage():
        f = Path(tmpdir) / "garbage.pt"
        f.write_bytes(b"not a checkpoint")
        return I.load_checkpoint(f)

    add("load_checkpoint/garbage", garbage)
    add("save_checkpoint/not a state", lambda: I.save_checkpoint(Path(tmpdir) / "c.pt", 3))
    add("kl_beta/ok", lambda: I.kl_beta(3, 10), "ok")

    # ---- uncertainty, calibration, geometry -------------------------------------------------------
    from bayesattn import calibration as C
    from bayesattn import geometry as G
    from bayesattn import uncertainty as U

    for nm, val in bad_ints.items():
        add(f"predict/num_samples {nm}", lambda val=val: U.predict(btc, xt, num_samples=val))
        add(f"predict/batch_size {nm}", lambda val=val: U.predict(btc, xt, batch_size=val))
    add("predict/mode", lambda: U.predict(btc, xt, mode="sample"))
    add("predict/seq2seq", lambda: U.predict(s2s, src))
    add("predict/zero-length", lambda: U.predict(btc, xt[:, :0]))
    add("predict/empty batch", lambda: U.predict(btc, xt[:0]))
    add("predict/ok", lambda: U.predict(btc, xt, num_samples=3), "ok")
    add("AttentionSamples/4-d", lambda: U.AttentionSamples(torch.rand(2, 2, 3, 3)))
    add("AttentionSamples/interval prob", lambda: U.AttentionSamples(
        torch.rand(2, 1, 1, 3, 3)).interval(1.5))
    add("PredictionResult/2-d", lambda: U.PredictionResult(torch.rand(2, 3)))
    add("PredictionResult/nan", lambda: U.PredictionResult(torch.full((2, 3, 2), nan)).summary(),
        "either")
    probs = torch.softmax(torch.randn(6, 3), -1)
    labels = torch.tensor([0, 1, 2, 0, 1, 2])
    add("ece/n_bins 0", lambda: C.expected_calibration_error(probs, labels, n_bins=0))
    add("ece/n_bins float", lambda: C.expected_calibration_error(probs, labels, n_bins=2.5))
    add("ece/labels range", lambda: C.expected_calibration_error(probs, labels + 3))
    add("ece/probs nan", lambda: C.expected_calibration_error(torch.full((6, 3), nan), labels))
    add("ece/strategy", lambda: C.expected_calibration_error(probs, labels, strategy="bad"))
    add("nll/probs sum", lambda: C.negative_log_likelihood(probs * 2, labels))
    add("brier/label float", lambda: C.brier_score(probs, labels.float() + 0.5))
    add("ood_auroc/empty", lambda: C.ood_auroc(torch.rand(3), torch.rand(0)))
    add("ood_auroc/nan", lambda: C.ood_auroc(torch.rand(3), torch.tensor([nan])))
    add("fit_temperature/max_iter 0", lambda: C.fit_temperature(torch.randn(6, 3), labels,
                                                                 max_iter=0))
    add("TemperatureScaler/neg", lambda: C.TemperatureScaler(-1.0))
    add("pavpu/threshold nan", lambda: C.pavpu(torch.rand(6), torch.ones(6, dtype=torch.bool), nan))
    add("geometry/entropy list", lambda: G.attention_entropy([[0.5, 0.5]]))
    add("geometry/entropy nan", lambda: G.attention_entropy(torch.full((2, 3), nan)))
    add("geometry/distance pos shape", lambda: G.mean_attention_distance(
        torch.rand(2, 3, 4), q_pos=torch.arange(5)))
    add("geometry/subspace which", lambda: G.head_subspace_angles(mha, which="z"))
    add("geometry/subspace not mha", lambda: G.head_subspace_angles(torch.nn.Linear(2, 2)))
    add("geometry/by_layer non module", lambda: G.attention_distance_by_layer(3, xt))

    # ---- models ---------------------------------------------------------------------------------
    from bayesattn import models as M

    add("exact_posterior/3-d q", lambda: M.exact_posterior(qh[0], kh))
    add("exact_posterior/nan", lambda: M.exact_posterior(torch.full_like(qh, nan), kh))
    add("exact_posterior/ok", lambda: M.exact_posterior(qh, kh), "ok")
    add("OnlineKeyRelevance/num_keys 0", lambda: M.OnlineKeyRelevance(0))
    add("OnlineKeyRelevance/alpha neg", lambda: M.OnlineKeyRelevance(3, alpha0=-1.0))
    add("OnlineKeyRelevance/num_keys float", lambda: M.OnlineKeyRelevance(2.5))
    add("fit_categorical_guide/steps 0", lambda: M.fit_categorical_guide(qh, kh, num_steps=0))
    add("fit_categorical_guide/steps float", lambda: M.fit_categorical_guide(qh, kh,
                                                                               num_steps=2.5))

    # ---- diagnostics ----------------------------------------------------------------------------
    from bayesattn import diagnostics as D

    add("psis_smooth/reff 0", lambda: D.psis_smooth(torch.randn(100).numpy(), reff=0.0))
    add("psis_smooth/reff neg", lambda: D.psis_smooth(torch.randn(100).numpy(), reff=-1.0))
    add("psis_smooth/reff nan", lambda: D.psis_smooth(torch.randn(100).numpy(), reff=nan))
    add("psis_smooth/reff str", lambda: D.psis_smooth(torch.randn(100).numpy(), reff="1"))
    add("psis_smooth/nan", lambda: D.psis_smooth([0.0, nan, 1.0]))
    add("psis_smooth/one", lambda: D.psis_smooth([0.0]))
    add("psis_smooth/str", lambda: D.psis_smooth("abc"))
    add("psis_smooth/2-d", lambda: D.psis_smooth(torch.randn(10, 10).numpy()), "either")
    add("psis_smooth/ok", lambda: D.psis_smooth(torch.randn(200).numpy()), "ok")
    add("interpret_khat/str", lambda: D.interpret_khat("a"))
    add("interpret_khat/nan", lambda: D.interpret_khat(nan), "ok",
        lambda s: s == "unreliable")
    w1 = torch.rand(4, 2, 2, 3, 3)
    w2 = torch.rand(4, 2, 2, 5, 5)
    add("to_arviz/stack different sizes", lambda: D.to_arviz_dict(
        {"encoder.layers.0.self_attn.weights": w1, "encoder.layers.1.self_attn.weights": w2},
        sample_dims=("sample",), stack_layers=True))
    add("to_arviz/stack one singleton", lambda: D.to_arviz_dict(
        {"encoder.layers.0.self_attn.weights": w1,
         "encoder.layers.1.self_attn.weights": w1.unsqueeze(1)},
        sample_dims=("sample",), stack_layers=True), "either",
        lambda o: "encoder.self_attn.weights" in o[0]["posterior"])
    add("to_arviz/stack 5-d with 4-d", lambda: D.to_arviz_dict(
        {"encoder.layers.0.self_attn.weights": w1,
         "encoder.layers.1.self_attn.weights": w1[:, 0]},
        sample_dims=("sample",), stack_layers=True))
    add("to_arviz/stack ok", lambda: D.to_arviz_dict(
        {"encoder.layers.0.self_attn.weights": w1, "encoder.layers.1.self_attn.weights": w1},
        sample_dims=("sample",), stack_layers=True), "ok",
        lambda o: o[0]["posterior"]["encoder.self_attn.weights"].shape == (1, 4, 2, 2, 2, 3, 3))
    add("to_arviz/sample mismatch", lambda: D.to_arviz_dict(
        {"a": torch.rand(4, 3), "b": torch.rand(5, 3)}, sample_dims=("sample",)))
    add("to_arviz/no draws", lambda: D.to_arviz_dict({"a": torch.rand(0, 3)},
                                                     sample_dims=("sample",)))
    add("to_arviz/nan draws", lambda: D.to_arviz_dict({"a": torch.full((4, 3), nan)},
                                                      sample_dims=("sample",)))
    add("to_arviz/num_chains", lambda: D.to_arviz_dict({"a": torch.rand(5, 3)},
                                                       sample_dims=("sample",), num_chains=2))
    add("to_arviz/num_chains float", lambda: D.to_arviz_dict({"a": torch.rand(4, 3)},
                                                             sample_dims=("sample",),
                                                             num_chains=2.0))
    add("to_arviz/not mapping", lambda: D.to_arviz_dict([1, 2]))
    add("to_arviz/tokens length", lambda: D.to_arviz_dict(
        {"w.weights": w1}, sample_dims=("sample",), tokens=["a", "b"]))
    add("to_arviz/obj values", lambda: D.to_arviz_dict({"a": object()}, sample_dims=("sample",)))

    # ---- data -----------------------------------------------------------------------------------
    from bayesattn import data as DA

    add("corrupt_images/kind", lambda: DA.corrupt_images(torch.rand(2, 8, 8), "blur", 1))
    add("corrupt_images/severity 0", lambda: DA.corrupt_images(torch.rand(2, 8, 8), "noise", 0))
    add("corrupt_images/severity float", lambda: DA.corrupt_images(torch.rand(2, 8, 8), "noise",
                                                                   2.5))
    add("corrupt_images/nan", lambda: DA.corrupt_images(torch.full((2, 8, 8), nan), "noise", 1))
    add("make_copy_task/n 0", lambda: DA.make_copy_task(0))
    add("make_copy_task/n float", lambda: DA.make_copy_task(2.5))
    add("images_to_patches/bad patch", lambda: DA.images_to_patches(torch.rand(2, 8, 8), 3))
    add("train_val_test_split/frac", lambda: DA.train_val_test_split(10, 1.5))

    # ---- plots, more models and data --------------------------------------------------------------
    from bayesattn import plots as PL

    png = str(Path(tmpdir) / "fig.png")
    add("plot_reliability/nan", lambda: PL.plot_reliability_diagram(torch.full((6, 3), nan),
                                                                     labels))
    add("plot_reliability/labels", lambda: PL.plot_reliability_diagram(probs, labels[:3]))
    add("plot_reliability/ok", lambda: PL.plot_reliability_diagram(probs, labels, path=png) and 0.0,
        "ok")
    add("plot_reliability/path dir", lambda: PL.plot_reliability_diagram(probs, labels,
                                                                          path=tmpdir))
    add("plot_histograms/bins 0", lambda: PL.plot_uncertainty_histograms(torch.rand(5),
                                                                         torch.rand(5), bins=0))
    add("plot_histograms/nan", lambda: PL.plot_uncertainty_histograms(torch.rand(5),
                                                                      torch.full((5,), nan)))
    add("plot_histograms/empty", lambda: PL.plot_uncertainty_histograms(torch.rand(5),
                                                                        torch.rand(0)))
    add("plot_risk_coverage/len", lambda: PL.plot_risk_coverage(torch.rand(5),
                                                                torch.ones(4, dtype=torch.bool)))
    add("plot_attention/shape", lambda: PL.plot_attention_uncertainty(torch.rand(3, 4),
                                                                      torch.rand(3, 5)))
    add("plot_attention/nan", lambda: PL.plot_attention_uncertainty(torch.full((3, 4), nan),
                                                                    torch.rand(3, 4)))
    add("plot_attention/labels", lambda: PL.plot_attention_uncertainty(
        torch.rand(3, 4), torch.rand(3, 4), query_labels=["a"]))
    add("plot_attention/3-d", lambda: PL.plot_attention_uncertainty(torch.rand(2, 3, 4),
                                                                    torch.rand(2, 3, 4)))
    add("plot_accuracy/thresholds", lambda: PL.plot_accuracy_vs_confidence(
        probs, labels, thresholds=[2.0]))
    add("plot_distance/not dict", lambda: PL.plot_attention_distance([1, 2]))
    add("attention_model/dtype", lambda: M.attention_model(qh.double(), kh))
    add("attention_model/log_prior shape", lambda: M.attention_model(qh, kh, torch.zeros(3, 4)))
    add("attention_model/all masked", lambda: M.exact_posterior(
        qh, kh, torch.full((2, 2, 3, 5), -inf)))
    add("OnlineKeyRelevance/update dim", lambda: M.OnlineKeyRelevance(5).update(
        torch.randn(3, 4), torch.randn(5, 3)))
    add("OnlineKeyRelevance/update keys", lambda: M.OnlineKeyRelevance(5).update(
        torch.randn(3, 4), torch.randn(6, 4)))
    add("OnlineKeyRelevance/update nan", lambda: M.OnlineKeyRelevance(5).update(
        torch.full((3, 4), nan), torch.randn(5, 4)))
    add("OnlineKeyRelevance/ok", lambda: M.OnlineKeyRelevance(5).update(
        torch.randn(3, 4), torch.randn(5, 4)).alpha, "ok")
    add("head_projection_weights/which", lambda: G.head_projection_weights(mha, which="x"))
    add("head_projection_weights/weight shape", lambda: G.head_projection_weights(
        mha, weight=torch.randn(3, 3)))
    add("make_translation_task/n neg", lambda: DA.make_translation_task(-1))
    add("make_reverse_task/len", lambda: DA.make_reverse_task(10, length=2, min_length=5))
    add("make_sort_task/vocab", lambda: DA.make_sort_task(10, vocab_size=0))
    add("images_to_patches/float patch", lambda: DA.images_to_patches(torch.rand(2, 8, 8), 2.0))
    add("corruption_suite/severity", lambda: DA.corruption_suite(torch.rand(2, 8, 8),
                                                                severities=(9,)))
    add("load_digits_data/frac", lambda: DA.load_digits_data(val_fraction=1.5))

    # ---- study, cli -----------------------------------------------------------------------------
    from bayesattn import study as ST

    add("StudyConfig/lr -1", lambda: ST.StudyConfig(lr=-1.0))
    add("StudyConfig/lr nan", lambda: ST.StudyConfig(lr=nan))
    add("StudyConfig/d_model % nhead", lambda: ST.StudyConfig(d_model=30, nhead=4))
    add("StudyConfig/nhead 0", lambda: ST.StudyConfig(nhead=0))
    add("StudyConfig/num_layers 0", lambda: ST.StudyConfig(num_layers=0))
    add("StudyConfig/dim_feedforward float", lambda: ST.StudyConfig(dim_feedforward=2.5))
    add("StudyConfig/epochs bool", lambda: ST.StudyConfig(epochs=True))
    add("StudyConfig/seed neg", lambda: ST.StudyConfig(seed=-1))
    add("StudyConfig/kl_anneal neg", lambda: ST.StudyConfig(kl_anneal_epochs=-1))
    add("StudyConfig/arviz_examples 0", lambda: ST.StudyConfig(arviz_examples=0))
    add("StudyConfig/methods str", lambda: ST.StudyConfig(methods="dirichlet"))
    add("StudyConfig/methods dup", lambda: ST.StudyConfig(methods=("dirichlet", "dirichlet")),
        "either")
    add("StudyConfig/severities empty", lambda: ST.StudyConfig(severities=()))
    add("StudyConfig/kl_weight str", lambda: ST.StudyConfig(kl_weight="1"))
    add("StudyConfig/dropout str", lambda: ST.StudyConfig(dropout="0.1"))
    add("StudyConfig/out int", lambda: ST.StudyConfig(out=3))
    add("StudyConfig/extra", lambda: ST.StudyConfig(extra={"lr": 1.0}), "either")

    def cli_case(*args):
        """Run the command line in-process: a clean non-zero exit with a message is a clear
        error; any exception escaping ``main`` (a traceback for the user) is not."""
        import contextlib
        import io

        from bayesattn.cli import main

        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                try:
                    rc = main(list(args))
                except SystemExit as e:
                    rc = e.code
        except Exception as e:  # noqa: BLE001
            raise RuntimeError(f"traceback from the CLI: {type(e).__name__}: {e}") from e
        if rc == 0:
            return "ran"
        raise CleanExit(f"bayesattn exited {rc}: {err.getvalue().strip()}")

    f = Path(tmpdir) / "out-file"
    f.write_text("x")
    add("cli/out is a file", lambda: cli_case("study", "--out", str(f), "--quick"))
    add("cli/out is a file force", lambda: cli_case("study", "--out", str(f), "--quick", "--force"))
    add("cli/out under a file", lambda: cli_case("study", "--out", str(f / "sub"), "--quick"))
    add("cli/epochs 0", lambda: cli_case("study", "--out", str(Path(tmpdir) / "s1"), "--epochs",
                                         "0"))
    add("cli/samples -1", lambda: cli_case("study", "--out", str(Path(tmpdir) / "s2"),
                                           "--samples", "-1"))
    add("cli/threads 0", lambda: cli_case("study", "--out", str(Path(tmpdir) / "s3"), "--threads",
                                          "-2", "--epochs", "0"))
    _new_surfaces(add, tmpdir)
    _round4_surfaces(add, tmpdir)
    _round5_surfaces(add, tmpdir)
    return cases


class _Stream(torch.utils.data.IterableDataset):
    """``n`` examples of a tiny classification task, without ``__len__``."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        g = torch.Generator().manual_seed(0)
        for _ in range(self.n):
            yield torch.randint(1, 6, (4,), generator=g), torch.randint(0, 2, (), generator=g)


class _SizedStream(_Stream):
    def __len__(self) -> int:
        return self.n


class _RowCounter(torch.nn.Module):
    """A foreign classifier that records how many rows each forward pass got."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 3)
        self.rows: list[int] = []

    def forward(self, x):
        self.rows.append(int(x.shape[0]))
        return self.lin(x.mean(-2))


def _new_surfaces(add, tmpdir) -> None:  # noqa: C901 - a flat list of cases
    """Cases for the surfaces added since the first catalogue (issue 19): models we did not write
    (convert, predict on them, post-hoc calibration, pickling), data sources, the ensemble and
    predictive-result checks, half precision."""
    import io

    import bayesattn as ba
    from bayesattn import families as PO
    from bayesattn import functional as F
    from bayesattn import training as I
    from bayesattn import uncertainty as U
    from bayesattn.interop import convert, unconvert
    from bayesattn.posthoc import _svi_core as posthoc

    nan = float("nan")
    small = dict(d_model=8, nhead=2, num_layers=1, dim_feedforward=16)
    TC = ba.TransformerClassifier
    xt = torch.randint(1, 6, (3, 4))

    # ---- predict: results, ensembles, foreign models ------------------------------------------
    p3 = torch.softmax(torch.randn(4, 5, 3), -1)
    res = U.PredictionResult(p3)
    add("log_likelihood/label out of range", lambda: res.log_likelihood(torch.tensor([5, 0, 1, 2, 0])))
    add("log_likelihood/label negative", lambda: res.log_likelihood(torch.tensor([-1, 0, 1, 2, 0])))
    add("log_likelihood/ok", lambda: res.log_likelihood(torch.tensor([2, 0, 1, 2, 0])), "ok",
        lambda o: bool(torch.allclose(o[:, 0], p3[:, 0, 2].log())))
    seq = U.PredictionResult(torch.softmax(torch.randn(2, 2, 3, 4), -1),
                             mask=torch.tensor([[True, True, False], [True, False, False]]))
    add("log_likelihood/padded label ignored", lambda: seq.log_likelihood(
        torch.tensor([[1, 2, -100], [3, -100, -100]])), "ok")
    add("PredictionResult/unnormalised", lambda: U.PredictionResult(torch.rand(4, 5, 3) + 1))
    add("PredictionResult/logits", lambda: U.PredictionResult(torch.randn(4, 5, 3)))
    add("PredictionResult/int probs", lambda: U.PredictionResult(torch.ones(4, 5, 1,
                                                                         dtype=torch.long)),
        "either")
    add("uncertainty_decomposition/unnormalised",
        lambda: F.uncertainty_decomposition(torch.rand(4, 5, 3) * 3))
    add("uncertainty_decomposition/ok", lambda: F.uncertainty_decomposition(p3), "ok",
        lambda o: bool((o[2] >= 0).all()))
    a2 = TC(2, vocab_size=6, **small)
    a3 = TC(3, vocab_size=6, **small)
    add("predict_ensemble/class counts differ", lambda: U.predict_ensemble([a2, a3], xt))
    add("predict_ensemble/ok", lambda: U.predict_ensemble([a2, TC(2, vocab_size=6, **small)], xt),
        "ok", lambda r: r.probs.shape == (2, 3, 2))

    counter = _RowCounter()
    add("predict foreign/batch_size respected", lambda: (counter.rows.clear(), U.predict(
        counter, torch.randn(10, 4, 8), num_samples=4, batch_size=6, mode="guide"),
        max(counter.rows))[2], "ok", lambda m: m <= 6)
    add("predict foreign/batch_size S > rows", lambda: (counter.rows.clear(), U.predict(
        counter, torch.randn(3, 4, 8), num_samples=8, batch_size=3, mode="guide"),
        max(counter.rows))[2], "ok", lambda m: m <= 3)
    add("predict foreign/vectorised batch_size", lambda: (counter.rows.clear(), U.predict(
        counter, torch.randn(10, 4, 8), num_samples=1, batch_size=4, vectorised=True),
        max(counter.rows))[2], "ok", lambda m: m <= 4)
    enc = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0), 1,
                                      enable_nested_tensor=False)

    class SeqFirst(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.enc, self.head = enc, torch.nn.Linear(8, 3)

        def forward(self, x):  # x (T, B, E)
            return self.head(self.enc(x))  # (T, B, 3): per-token logits, sequence first

    class SeqFirstPooled(SeqFirst):
        def forward(self, x):  # x (T, B, E)
            return self.head(self.enc(x).mean(0))  # (B, 3)

    sf = convert(SeqFirst(), family="dirichlet")
    sfp = convert(SeqFirstPooled(), family="dirichlet")
    add("predict foreign/sequence-first", lambda: U.predict(sf, torch.randn(10, 8, 8),
                                                             num_samples=3))
    add("predict foreign/sequence-first pooled", lambda: U.predict(sfp, torch.randn(10, 8, 8),
                                                                    num_samples=3))
    add("predict foreign/returns str", lambda: U.predict(counter, torch.randn(2, 4, 8),
                                                          forward=lambda m, x: "logits"))
    add("predict foreign/returns int", lambda: U.predict(
        counter, torch.randn(2, 4, 8), forward=lambda m, x: m(x).long()))

    try:
        import transformers
    except ImportError:  # pragma: no cover - the hf extra is installed in CI
        transformers = None
    if transformers is not None:
        from bayesattn.interop.hf import convert_hf

        cfg = transformers.BertConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                      intermediate_size=32, vocab_size=20,
                                      attn_implementation="eager")
        base = convert_hf(transformers.BertModel(cfg).eval())
        ids = {"input_ids": torch.randint(0, 20, (2, 5))}
        add("predict foreign/hf base model", lambda: U.predict(base, ids, num_samples=2))
        from bayesattn.interop.hf import bayesian_attention_forward, unconvert_hf

        attn = base.encoder.layer[0].attention.self
        qh = torch.randn(1, 2, 3, 8)
        add("hf/unknown interface argument", lambda: bayesian_attention_forward(
            attn, qh, qh, qh, None, s_aux=torch.zeros(2)))
        add("hf/num_samples context", lambda: _with_samples(3, lambda: base(**ids)), "ok",
            lambda o: o.last_hidden_state.shape == (3, 2, 5, 16))
        add("hf/encoder without its model", lambda: convert_hf(
            torch.nn.Sequential(transformers.BertModel(cfg).encoder)))
        add("hf/unconvert never converted", lambda: unconvert_hf(
            transformers.BertModel(cfg)).config._attn_implementation, "ok",
            lambda impl: impl == "eager")
        add("hf/all keys masked", lambda: bayesian_attention_forward(
            attn, qh, qh, qh, torch.full((1, 1, 3, 3), torch.finfo(torch.float32).min))[1],
            "ok", lambda w: bool(torch.allclose(w.sum(-1), torch.ones(()))))

    # ---- convert: sharing, subclasses, the swapped class ---------------------------------------
    def shared():
        mha = torch.nn.MultiheadAttention(8, 2)
        m = convert(torch.nn.ModuleList([mha, mha]), family="dirichlet")
        return m[0] is m[1] and isinstance(m[1], ba.BayesianMultiheadAttention)

    add("convert/shared module", shared, "ok", lambda o: o is True)

    def unconvert_shared():
        m = ba.BayesianMultiheadAttention(8, 2)
        out = unconvert(torch.nn.ModuleList([m, m]))
        return out[0] is out[1] and type(out[0]) is torch.nn.MultiheadAttention

    add("unconvert/shared module", unconvert_shared, "ok", lambda o: o is True)

    class OwnForward(torch.nn.MultiheadAttention):
        def forward(self, *a, **k):  # type: ignore[override]
            return super().forward(*a, **k)

    def own_forward():
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return convert(torch.nn.ModuleList([OwnForward(8, 2)]), family="dirichlet")

    add("convert/only a subclass with its own forward", own_forward)
    add("convert/subclass named in layers", lambda: convert(
        torch.nn.ModuleDict({"a": OwnForward(8, 2)}), layers=["a"]))

    def swapped():
        torch_cls = torch.nn.MultiheadAttention
        try:
            torch.nn.MultiheadAttention = ba.BayesianMultiheadAttention
            return type(ba.BayesianMultiheadAttention(8, 2).to_torch()) is torch_cls
        finally:
            torch.nn.MultiheadAttention = torch_cls

    add("to_torch/after the drop-in swap", swapped, "ok", lambda o: o is True)

    def pickled():
        net = TC(2, vocab_size=6, attention="dirichlet", **small)
        buf = io.BytesIO()
        torch.save(net, buf)
        buf.seek(0)
        return torch.load(buf, weights_only=False)

    add("torch.save/whole network", pickled, "ok")

    # ---- post-hoc calibration -------------------------------------------------------------------
    class Clf(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(6, 8)
            self.enc = torch.nn.TransformerEncoder(
                torch.nn.TransformerEncoderLayer(8, 2, 16, 0.0, batch_first=True), 1,
                enable_nested_tensor=False)
            self.head = torch.nn.Linear(8, 3)

        def forward(self, x):
            return self.head(self.enc(self.emb(x)).mean(-2))

    pc = convert(Clf(), family="dirichlet")
    px, py = torch.randint(0, 6, (8, 4)), torch.randint(0, 3, (8,))

    def nan_model():
        m = convert(Clf(), family="dirichlet")
        with torch.no_grad():
            m.head.weight.fill_(nan)
        return posthoc.fit_posthoc(m, px, py, steps=2, batch_size=4)

    add("fit_posthoc/nan logits", nan_model)
    add("fit_posthoc/label 3 of 3", lambda: posthoc.fit_posthoc(pc, px, torch.full_like(py, 3),
                                                                steps=1))
    add("fit_posthoc/label -1", lambda: posthoc.fit_posthoc(pc, px, torch.full_like(py, -1),
                                                            steps=1))
    add("fit_posthoc/float labels", lambda: posthoc.fit_posthoc(pc, px, py.float(), steps=1))
    add("fit_posthoc/bool labels", lambda: posthoc.fit_posthoc(pc, px, py > 0, steps=1))
    add("fit_posthoc/empty", lambda: posthoc.fit_posthoc(pc, px[:0], py[:0], steps=1))
    add("fit_posthoc/seed neg", lambda: posthoc.fit_posthoc(pc, px, py, steps=1, seed=-3))
    add("fit_posthoc/seed str", lambda: posthoc.fit_posthoc(pc, px, py, steps=1, seed="0"))
    add("fit_posthoc/x list", lambda: posthoc.fit_posthoc(pc, [[1, 2]], py, steps=1))
    add("fit_posthoc/lr nan", lambda: posthoc.fit_posthoc(pc, px, py, steps=1, lr=nan))
    add("fit_posthoc/ok", lambda: posthoc.fit_posthoc(pc, px, py, steps=2, batch_size=4).history,
        "ok")

    # ---- training data ------------------------------------------------------------------------
    def fit_stream(n, num_data, declared=None, **kw):
        net = TC(2, vocab_size=6, **small)
        stream = _Stream(n)
        if declared is not None:
            stream.num_data = declared  # a stream that subsamples a set of that size
        return I.fit(net, stream, num_data=num_data, epochs=1, batch_size=4, progress=False,
                     **kw)

    add("fit/stream num_data too small", lambda: fit_stream(12, 4))
    # round 5: an undeclared short pass is refused (the ELBO scale would be wrong)
    add("fit/stream num_data above one pass", lambda: fit_stream(12, 40))
    add("fit/stream declared subsample", lambda: fit_stream(12, 40, declared=40), "ok")
    add("fit/stream num_data ok", lambda: fit_stream(12, 12), "ok")
    add("fit/stream drop_last remainder", lambda: fit_stream(14, 14, drop_last=True), "ok")
    add("fit/sized stream num_data differs", lambda: I.fit(
        TC(2, vocab_size=6, **small), _SizedStream(12), num_data=30, epochs=1, batch_size=4,
        progress=False))
    add("fit/early stopping without val_data", lambda: I.fit(
        TC(2, vocab_size=6, **small), (xt, torch.tensor([0, 1, 0])), epochs=1,
        early_stopping_patience=2, progress=False))

    # ---- half precision -----------------------------------------------------------------------
    logits = torch.randn(2, 2, 3, 5)
    for fname in ("dirichlet", "logistic_normal", "weibull", "concrete"):
        for dt in (torch.float16, torch.bfloat16):
            def half(fname=fname, dt=dt):
                fam = PO.get_family(fname, num_heads=2).to(dt)
                d = fam.guide(logits.to(dt))
                w = fam.to_weights(d.rsample(), None)
                return w, fam.kl(d, fam.model(None, logits.to(dt)))

            add(f"{fname}/guide {dt}", half, "either",
                lambda o: o[0].dtype in (torch.float16, torch.bfloat16)
                and bool(torch.allclose(o[0].float().sum(-1), torch.ones(()), atol=1e-2)))


def _round4_surfaces(add, tmpdir) -> None:  # noqa: C901 - a flat list of cases
    """Round 4 (issue 33): the surfaces added since 0.4 — the reduced key supports (local +
    global, cluster top-k, tiled, low-rank), the registries, ``posterior_kl``, the post-hoc GP
    read and the GP maths, the predictive engine, and ``study --merge``/``--jobs``/``--seeds``;
    with silent-correctness checks where an exact answer exists. Names start with ``r4 ``."""
    import json
    import shutil

    import bayesattn as ba
    from bayesattn.functional import gaussian_process as G
    from bayesattn.nn import supports as NS
    from bayesattn.posthoc._gp_core import fit_posthoc_gp
    from bayesattn.predictive import Predictive

    nan, inf = float("nan"), float("inf")
    M = ba.BayesianMultiheadAttention

    def r4(name, fn, expect="error", check=None, finite=True):
        add(f"r4 {name}", fn, expect, check, finite)

    # ---- reduced key supports through the layer -------------------------------------------
    def pair(kernel, family=None, E=8, H=2):
        torch.manual_seed(0)
        dense = M(E, H, batch_first=True, family=family)
        m = M(E, H, batch_first=True, family=family, support=kernel)
        m.load_state_dict(dense.state_dict(), strict=False)
        return dense, m

    def equal_dense(kernel, T=6, mask=None, **kw):
        def run():
            dense, m = pair(kernel)
            x = torch.randn(2, T, 8)
            with ba.attention_mode("mean"), torch.no_grad():
                return m(x, x, x, key_padding_mask=mask, **kw)[0], dense(
                    x, x, x, key_padding_mask=mask, **kw)[0]  # fmt: skip
        return run

    def close(o):
        return bool(torch.allclose(o[0], o[1], atol=1e-5))

    r4("local_global/window >= T equals dense",
       equal_dense(NS.LocalGlobalSupport(window=8, global_tokens=(0, 2))), "ok", close)
    r4("local_global/T=1 equals dense", equal_dense(NS.LocalGlobalSupport(window=1), T=1), "ok",
       close)
    r4("tiled/equals dense", equal_dense(NS.TiledSupport(tile=4), T=9), "ok", close)
    r4("tiled/tile > T equals dense", equal_dense(NS.TiledSupport(tile=64), T=3), "ok", close)
    r4("topk/k > T equals dense", equal_dense(NS.TopKSupport(k=50), T=5), "ok", close)
    r4("local/window >= T equals dense", equal_dense(NS.LocalSupport(window=10), T=5), "ok",
       close)
    pad = torch.zeros(2, 6, dtype=torch.bool)
    pad[1, 4:] = True
    r4("local_global/padding, window >= T equals dense",
       equal_dense(NS.LocalGlobalSupport(window=8), mask=pad), "ok", close)
    r4("tiled/padding equals dense", equal_dense(NS.TiledSupport(tile=4), mask=pad), "ok", close)
    full = torch.zeros(2, 6, dtype=torch.bool)
    full[1] = True
    for kname, kern in (("local_global", NS.LocalGlobalSupport(window=2)),
                        ("tiled", NS.TiledSupport(tile=4)), ("topk", NS.TopKSupport(k=3)),
                        ("cluster_topk", NS.ClusterTopKSupport(k=3, num_clusters=2)),
                        ("lowrank", NS.LowRankSupport(rank=3, max_len=8))):  # fmt: skip
        r4(f"{kname}/fully padded row reads nothing", equal_dense(kern, mask=full), "ok",
           lambda o: bool(torch.allclose(o[0][1], o[1][1], atol=1e-5)))
        for dt in (torch.float16, torch.bfloat16):
            def half(kern=kern, dt=dt):
                m = M(8, 2, batch_first=True, support=kern).to(dt)
                x = torch.randn(2, 6, 8, dtype=dt)
                with ba.attention_mode("mean"):
                    return m(x, x, x)[0]
            r4(f"{kname}/{dt} input", half, "either", lambda o: o.dtype in (torch.float16,
                                                                         torch.bfloat16))
        r4(f"{kname}/int input", lambda kern=kern: M(8, 2, batch_first=True, support=kern)(
            *(torch.ones(2, 6, 8, dtype=torch.long),) * 3))
        r4(f"{kname}/nan query", lambda kern=kern: M(8, 2, batch_first=True, support=kern)(
            *(torch.full((2, 6, 8), nan),) * 3))
        r4(f"{kname}/inf key", lambda kern=kern: M(8, 2, batch_first=True, support=kern)(
            torch.randn(2, 6, 8), torch.full((2, 6, 8), inf), torch.randn(2, 6, 8)))
        r4(f"{kname}/meta input, cpu layer", lambda kern=kern: M(
            8, 2, batch_first=True, support=kern)(*(torch.randn(2, 6, 8, device="meta"),) * 3))
        r4(f"{kname}/meta input, meta layer", lambda kern=kern: M(
            8, 2, batch_first=True, support=kern, device="meta")(
            *(torch.randn(2, 6, 8, device="meta"),) * 3), "either")

        def sampled(kern=kern):
            m = M(8, 2, batch_first=True, support=kern, family="dirichlet")
            x = torch.randn(2, 6, 8)
            _, w = m(x, x, x, key_padding_mask=pad)
            rows = w.weights if w.index is None else w.to_dense()
            return rows[0]
        r4(f"{kname}/drawn weights sum to one", sampled, "ok",
           lambda w: bool(torch.allclose(w.sum(-1), torch.ones(()), atol=1e-4)))
    r4("dense/meta input, meta layer", lambda: M(8, 2, batch_first=True, device="meta")(
        *(torch.randn(2, 6, 8, device="meta"),) * 3)[0], "either",
       lambda o: o.shape == (2, 6, 8) and o.device.type == "meta")
    for name, kw in (("global_tokens None", dict(global_tokens=None)),
                     ("global_tokens str", dict(global_tokens="0")),
                     ("global_tokens negative", dict(global_tokens=(-1,))),
                     ("global_tokens float", dict(global_tokens=(1.5,))),
                     ("window negative", dict(window=-1)),
                     ("window float", dict(window=2.5))):  # fmt: skip
        r4(f"local_global/{name}", lambda kw=kw: NS.LocalGlobalSupport(**kw))
    # round 5: the global tokens are a set of positions, a repeat is the same position
    r4("local_global/global_tokens repeated", lambda: NS.LocalGlobalSupport(
        global_tokens=(2, 2)).global_tokens, "ok", lambda t: t == (2,))
    r4("local_global/global token >= T", lambda: M(8, 2, batch_first=True,
       support=NS.LocalGlobalSupport(window=2, global_tokens=(50,)))(*(torch.randn(1, 10, 8),) * 3))
    r4("local_global/global tokens ()", equal_dense(NS.LocalGlobalSupport(window=8,
                                                                       global_tokens=())),
       "ok", close)
    for name, kw in (("k 0", dict(k=0)), ("k float", dict(k=2.5)), ("clusters 0",
                     dict(num_clusters=0)), ("probes 0", dict(probes=0)), ("iters -1",
                     dict(iters=-1))):  # fmt: skip
        r4(f"cluster_topk/{name}", lambda kw=kw: NS.ClusterTopKSupport(**kw))
    causal = torch.nn.Transformer.generate_square_subsequent_mask(6)
    r4("cluster_topk/causal + padding", equal_dense(
        NS.ClusterTopKSupport(k=6, num_clusters=1, probes=1), mask=pad, attn_mask=causal,
        is_causal=True), "ok", close)
    r4("cluster_topk/attn_mask without is_causal", lambda: M(
        8, 2, batch_first=True, support=NS.ClusterTopKSupport(k=3))(
        *(torch.randn(2, 6, 8),) * 3, attn_mask=causal))
    r4("lowrank/float padding mask", lambda: M(8, 2, batch_first=True,
       support=NS.LowRankSupport(rank=3, max_len=8))(*(torch.randn(2, 6, 8),) * 3,
       key_padding_mask=torch.zeros(2, 6).masked_fill(pad, -inf)), "ok")
    r4("lowrank/soft float padding mask", lambda: M(8, 2, batch_first=True,
       support=NS.LowRankSupport(rank=3, max_len=8))(*(torch.randn(2, 6, 8),) * 3,
       key_padding_mask=torch.full((2, 6), -0.5)))
    r4("lowrank/T > max_len", lambda: M(8, 2, batch_first=True,
       support=NS.LowRankSupport(rank=3, max_len=4))(*(torch.randn(2, 6, 8),) * 3))
    r4("lowrank/is_causal", lambda: M(8, 2, batch_first=True,
       support=NS.LowRankSupport(rank=3, max_len=8))(*(torch.randn(2, 6, 8),) * 3,
       attn_mask=causal, is_causal=True))
    r4("tiled/tile 0", lambda: NS.TiledSupport(tile=0))
    r4("topk/k 0", lambda: NS.TopKSupport(k=0))

    # ---- registries ---------------------------------------------------------------------------
    r4("register_support/dense", lambda: ba.register_support("dense", NS.LocalSupport))
    r4("register_support/dense override", lambda: ba.register_support(
        "dense", NS.LocalSupport, override=True))
    r4("register_support/duplicate", lambda: ba.register_support("local", NS.LocalSupport))
    r4("register_support/not a kernel", lambda: ba.register_support("r4_bad", torch.nn.Linear))
    r4("register_support/an instance", lambda: ba.register_support("r4_bad",
                                                                    NS.LocalSupport()))
    r4("register_support/bad name", lambda: ba.register_support("not a name", NS.LocalSupport))
    r4("register_support/int name", lambda: ba.register_support(3, NS.LocalSupport))
    r4("register_family/duplicate", lambda: ba.register_family(
        "dirichlet", ba.families.DirichletWeights))
    r4("register_family/not a family", lambda: ba.register_family("r4_bad", torch.nn.Linear))
    r4("register_prior/duplicate", lambda: ba.register_prior("causal", ba.CausalPrior))
    r4("register_prior/not a prior", lambda: ba.register_prior("r4_bad", dict))

    def factory_builds_wrong():
        from bayesattn.nn.supports import SUPPORTS

        SUPPORTS.register("r4_wrong", lambda **kw: torch.nn.Linear(2, 2))
        try:
            return NS.get_support("r4_wrong")
        finally:
            SUPPORTS.unregister("r4_wrong")
    r4("register_support/factory returns a non-kernel", factory_builds_wrong)
    r4("get_support/unknown", lambda: NS.get_support("nope"))
    r4("get_support/dense with options", lambda: NS.get_support("dense", window=3))

    # ---- posterior_kl ---------------------------------------------------------------------------
    small = dict(d_model=8, nhead=2, num_layers=1, dim_feedforward=16)
    TC = ba.TransformerClassifier
    kl_net = TC(2, vocab_size=6, attention="dirichlet", **small)
    xt = torch.randint(1, 6, (4, 5))
    r4("posterior_kl/ok", lambda: kl_net.posterior_kl(xt), "ok",
       lambda o: bool((o[0] >= 0).all()) and o[1] >= 0)
    r4("posterior_kl/last_layer >= 0", lambda: TC(2, vocab_size=6,
       attention=ba.AttentionConfig.last_layer(), **small).posterior_kl(xt), "ok",
       lambda o: bool((o[0] >= 0).all()) and o[1] >= 0)
    r4("posterior_kl/empty", lambda: kl_net.posterior_kl(xt[:0]))
    r4("posterior_kl/T=1", lambda: kl_net.posterior_kl(xt[:, :1]), "ok",
       lambda o: bool((o[0] >= 0).all()))
    r4("posterior_kl/batch_size 0", lambda: kl_net.posterior_kl(xt, batch_size=0))
    r4("posterior_kl/num_samples 0", lambda: kl_net.posterior_kl(xt, num_samples=0))
    r4("posterior_kl/float x", lambda: kl_net.posterior_kl(xt.float()))
    r4("posterior_kl/token out of range", lambda: kl_net.posterior_kl(xt + 10))
    r4("posterior_kl/no latents float zeros", lambda: TC(2, vocab_size=6, **small).posterior_kl(
        xt), "ok", lambda o: o[0].is_floating_point() and o[1] == 0.0)

    # ---- the predictive engine --------------------------------------------------------------
    r4("Predictive/probs sum to one", lambda: Predictive(kl_net, 3, batch_size=2)(xt).probs,
       "ok", lambda p: bool(torch.allclose(p.sum(-1), torch.ones(()), atol=1e-5)))
    r4("Predictive/num_samples 0", lambda: Predictive(kl_net, 0))
    r4("Predictive/batch_size 0", lambda: Predictive(kl_net, 2, batch_size=0))
    r4("Predictive/empty x", lambda: Predictive(kl_net, 2)(xt[:0]))
    r4("Predictive/too many draws", lambda: Predictive(kl_net, 10**15, batch_size=1)(xt))
    r4("Predictive/mode bad", lambda: Predictive(kl_net, 2, mode="posterior"))
    for name, y in (("short", torch.tensor([0, 1])), ("out of range", torch.tensor([0, 1, 2, 0])),
                    ("negative", torch.tensor([0, -1, 1, 0])), ("float", torch.zeros(4)),
                    ("2-D", torch.zeros(4, 1, dtype=torch.long))):  # fmt: skip
        r4(f"probs_and_targets/labels {name}", lambda y=y: Predictive(kl_net, 2)
           .probs_and_targets(xt, y))
    r4("probs_and_targets/ok", lambda: Predictive(kl_net, 2).probs_and_targets(
        xt, torch.tensor([0, 1, 1, 0])), "ok",
        lambda o: bool(torch.allclose(o[0].sum(-1), torch.ones(()), atol=1e-5)))

    # ---- the post-hoc GP read and the GP maths ----------------------------------------------
    class Feat(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.head = torch.nn.Linear(4, 3)
            with torch.no_grad():
                self.head.weight.mul_(4)

        def forward(self, x):
            return self.head(x)

    gm = Feat()
    gx = torch.randn(32, 4)
    gy = gm(gx).argmax(-1).detach()
    gy[::4] = (gy[::4] + 1) % 3
    read = fit_posthoc_gp(gm, gx, gy, gm.head, num_features=64)
    r4("gp/probs sum to one", lambda: read.probs(torch.randn(5, 4)), "ok",
       lambda p: bool(torch.allclose(p.sum(-1), torch.ones(()), atol=1e-5)))
    r4("gp/sample_probs sum to one", lambda: read.sample_probs(torch.randn(5, 4), 4, seed=0),
       "ok", lambda p: p.shape == (4, 5, 3) and bool(torch.allclose(p.sum(-1), torch.ones(()),
                                                                       atol=1e-5)))
    r4("gp/variance >= 0, smallest near calibration", lambda: (
        read.variance(gx[:8]), read.variance(gx[:8] * 0 + 50)), "ok",
        lambda o: bool((o[0] >= 0).all()) and float(o[0].max()) < float(o[1].min()))
    r4("gp/deterministic probs", lambda: torch.equal(read.probs(gx[:4]), read.probs(gx[:4])),
       "ok", lambda o: o is True)
    for name, kw in (("identical features", dict(x_cal=gx[:1].expand(16, 4), y_cal=gy[:16])),
                     ("all-zero features", dict(x_cal=torch.zeros(16, 4), y_cal=gy[:16])),
                     ("one example", dict(x_cal=gx[:1], y_cal=gy[:1])),
                     ("two examples", dict(x_cal=gx[:2], y_cal=gy[:2]))):  # fmt: skip
        r4(f"gp/{name}", lambda kw=kw: fit_posthoc_gp(gm, head=gm.head, num_features=16,
                                                      **kw).probs(gx[:3]), "ok",
           lambda p: bool(torch.allclose(p.sum(-1), torch.ones(()), atol=1e-5)))
    for name, kw in (("empty", dict(x_cal=gx[:0], y_cal=gy[:0])),
                     ("labels float", dict(x_cal=gx, y_cal=gy.float())),
                     ("labels short", dict(x_cal=gx, y_cal=gy[:3])),
                     ("labels out of range", dict(x_cal=gx, y_cal=gy + 3)),
                     ("labels 2-D", dict(x_cal=gx, y_cal=gy[:, None])),
                     ("labels list", dict(x_cal=gx, y_cal=gy.tolist())),
                     ("outputscales ()", dict(x_cal=gx, y_cal=gy, outputscales=())),
                     ("outputscales negative", dict(x_cal=gx, y_cal=gy, outputscales=(-1.0,))),
                     ("outputscales nan", dict(x_cal=gx, y_cal=gy, outputscales=(nan,))),
                     ("outputscales str", dict(x_cal=gx, y_cal=gy, outputscales="1")),
                     ("num_features 0", dict(x_cal=gx, y_cal=gy, num_features=0)),
                     ("seed negative", dict(x_cal=gx, y_cal=gy, seed=-1)),
                     ("batch_size 0", dict(x_cal=gx, y_cal=gy, batch_size=0)),
                     ("nan x", dict(x_cal=torch.full_like(gx, nan), y_cal=gy))):  # fmt: skip
        r4(f"gp/{name}", lambda kw=kw: fit_posthoc_gp(gm, head=gm.head, **kw))
    r4("gp/head not in the model", lambda: fit_posthoc_gp(gm, gx, gy, torch.nn.Linear(4, 3)))
    r4("gp/head not a module", lambda: fit_posthoc_gp(gm, gx, gy, "head"))
    r4("gp/int32 labels", lambda: fit_posthoc_gp(gm, gx, gy.int(), gm.head,
                                                 num_features=16).temperature, "ok")
    r4("gp/probs of no inputs", lambda: read.probs(gx[:0]))
    r4("gp/variance nan x", lambda: read.variance(torch.full((2, 4), nan)))
    r4("gp/probs inf x", lambda: read.probs(torch.full((2, 4), inf)))
    r4("gp/half_variance nan phi", lambda: read.half_variance(torch.full((2, 64), nan)))
    r4("gp/half_variance wrong shape", lambda: read.half_variance(torch.zeros(2, 5)))
    r4("gp/sample_probs num_samples 0", lambda: read.sample_probs(gx[:2], 0))
    t = torch.tensor
    xg, zg = torch.randn(1, 3, 2), torch.randn(1, 4, 2)
    for ls in (0.0, -1.0, nan, inf):
        r4(f"gp maths/lengthscale {ls}", lambda ls=ls: G.rbf_covariance(xg[0], zg[0], t(ls),
                                                                        t(1.0)))
    r4("gp maths/outputscale -1", lambda: G.matern52_covariance(xg[0], zg[0], t(1.0), t(-1.0)))
    r4("gp maths/jitter -1", lambda: G.whitened_projection(xg, zg, t([1.0]), t([1.0]),
                                                           jitter=-1.0))
    r4("gp maths/non-triangular factor", lambda: G.whitened_kl(torch.zeros(1, 1, 4),
                                                               torch.ones(1, 4, 4)))
    r4("gp maths/KL >= 0", lambda: float(G.whitened_kl(torch.randn(1, 2, 4),
                                                       torch.eye(4)[None] * 0.3)), "ok",
       lambda v: v >= 0)
    r4("gp maths/variance >= 0", lambda: G.sparse_gp_marginals(
        *G.whitened_projection(xg, zg, t([1.0]), t([1.0])), torch.zeros(1, 2, 4),
        torch.eye(4)[None])[1], "ok", lambda v: bool((v >= 0).all()))

    # ---- the study's command line: --merge, --jobs, --seeds ----------------------------------
    from bayesattn.cli import main

    def cli(*args):
        import contextlib
        import io

        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                rc = main(list(args))
            except SystemExit as e:
                rc = e.code
        if rc == 0:
            return "ran"
        raise CleanExit(f"bayesattn exited {rc}: {err.getvalue().strip()}")

    base = Path(tmpdir) / "r4"
    base.mkdir(exist_ok=True)
    r4("cli/--jobs 0", lambda: cli("study", "--out", str(base / "j0"), "--jobs", "0",
                                   "--epochs", "1"))
    r4("cli/--jobs -1", lambda: cli("study", "--out", str(base / "j1"), "--jobs", "-1",
                                    "--epochs", "1"))
    r4("cli/--seeds 0", lambda: cli("study", "--out", str(base / "s0"), "--seeds", "0",
                                    "--epochs", "1"))
    notstudy = base / "notstudy"
    notstudy.mkdir(exist_ok=True)
    (notstudy / "results.json").write_text(json.dumps({"accuracy": 1.0}))
    empty = base / "empty"
    empty.mkdir(exist_ok=True)
    fake = base / "fake"  # a study folder whose results.json lists a file that is gone
    fake.mkdir(exist_ok=True)
    (fake / "results.json").write_text(json.dumps({
        "config": {}, "datasets": {}, "methods": [], "seeds": [0], "pairs": [], "seconds": 0,
        "files": ["gone.png", "results.json"]}))
    r4("merge/one source", lambda: cli("study", "--merge", str(fake), "--out", str(base / "m1")))
    r4("merge/not a study", lambda: cli("study", "--merge", str(notstudy), str(fake),
                                        "--out", str(base / "m2")))
    r4("merge/no results.json", lambda: cli("study", "--merge", str(empty), str(fake),
                                            "--out", str(base / "m3")))
    copy = base / "fake2"
    if not copy.exists():
        shutil.copytree(fake, copy)
    r4("merge/missing listed file", lambda: cli("study", "--merge", str(fake), str(copy),
                                                "--out", str(base / "m4")))
    r4("merge/same folder twice", lambda: cli("study", "--merge", str(fake), str(fake),
                                              "--out", str(base / "m5")))
    r4("merge/into a source", lambda: cli("study", "--merge", str(fake), str(copy), "--out",
                                          str(copy), "--force"))
    r4("merge_studies/str sources", lambda: __import__(
        "bayesattn.study.merge", fromlist=["merge_studies"]).merge_studies(str(fake),
                                                                           base / "m6"))


def _round5_surfaces(add, tmpdir) -> None:  # noqa: C901 - a flat list of cases
    """Round 5 (issue 43, the part outside the post-hoc reads and the study): the maths floor
    (NIW, the mixture KL, the GP maths), eval modes and explicit draws, ``AttentionRead``,
    saving and loading, Hugging Face conversion, the newest supports' edges and ``fit``/
    ``Predictive`` on foreign or shapeless models; with exact checks where an answer is known.
    Names start with ``r5 ``."""
    import copy
    import io

    import bayesattn as ba
    from bayesattn.functional import gaussian_process as G
    from bayesattn.functional import mixture as MX
    from bayesattn.functional import niw as N
    from bayesattn.nn import supports as NS
    from bayesattn.predictive import Predictive

    nan, inf = float("nan"), float("inf")
    d64 = torch.float64
    M = ba.BayesianMultiheadAttention

    def r5(name, fn, expect="error", check=None, finite=True):
        add(f"r5 {name}", fn, expect, check, finite)

    # ---- the maths floor: NIW ---------------------------------------------------------------
    def niw(mean=None, kappa=1.0, scale=None, df=4.0):
        mean = torch.zeros(2, dtype=d64) if mean is None else mean
        scale = torch.eye(2, dtype=d64) if scale is None else scale
        return N.NIW(mean, kappa, scale, df)

    r5("niw/ok", lambda: niw().dim, "ok", lambda d: d == 2)
    r5("niw/scale nan", lambda: niw(scale=torch.full((2, 2), nan, dtype=d64)))
    r5("niw/scale inf", lambda: niw(scale=torch.eye(2, dtype=d64) * inf))
    r5("niw/scale not positive definite", lambda: niw(scale=torch.tensor([[1.0, 2.0], [2.0, 1.0]],
                                                                         dtype=d64)))
    r5("niw/scale negative", lambda: niw(scale=-torch.eye(2, dtype=d64)))
    r5("niw/scale zero", lambda: niw(scale=torch.zeros(2, 2, dtype=d64)))
    r5("niw/scale not symmetric", lambda: niw(scale=torch.tensor([[1.0, 0.5], [0.0, 1.0]],
                                                                 dtype=d64)))
    r5("niw/scale int", lambda: niw(scale=torch.eye(2, dtype=torch.long)))
    r5("niw/scale list", lambda: niw(scale=[[1.0, 0.0], [0.0, 1.0]]))
    r5("niw/mean nan", lambda: niw(mean=torch.tensor([nan, 0.0], dtype=d64)))
    r5("niw/mean 2-D", lambda: niw(mean=torch.zeros(1, 2, dtype=d64)))
    r5("niw/kappa str", lambda: niw(kappa="1"))
    r5("niw/kappa 0", lambda: niw(kappa=0.0))
    r5("niw/df bool", lambda: niw(df=True))
    r5("niw/df below D - 1", lambda: niw(df=0.5))
    post = N.niw_posterior(torch.randn(12, 2, dtype=d64), niw())
    r5("niw_posterior/h nan", lambda: N.niw_posterior(torch.full((3, 2), nan, dtype=d64), niw()))
    r5("niw_posterior/h 1e200", lambda: N.niw_posterior(torch.full((3, 2), 1e200, dtype=d64)
                                                         * torch.tensor([1.0, -1.0], dtype=d64),
                                                         niw()))
    r5("niw_posterior/h int", lambda: N.niw_posterior(torch.ones(3, 2, dtype=torch.long), niw()))
    r5("niw_posterior/h wrong D", lambda: N.niw_posterior(torch.zeros(3, 5, dtype=d64), niw()))
    r5("niw_posterior/sequential = batch", lambda: (
        N.niw_posterior(torch.arange(8.0, dtype=d64).view(4, 2), niw()),
        N.niw_posterior(torch.arange(4.0, 8.0, dtype=d64).view(2, 2),
                        N.niw_posterior(torch.arange(4.0, dtype=d64).view(2, 2), niw()))),
       "ok", lambda o: bool(torch.allclose(o[0].scale, o[1].scale)) and o[0].df == o[1].df)
    r5("niw_log_predictive/x nan", lambda: N.niw_log_predictive(
        torch.tensor([[nan, 0.0]], dtype=d64), post))
    r5("niw_log_predictive/x inf", lambda: N.niw_log_predictive(
        torch.tensor([[inf, 0.0]], dtype=d64), post))
    r5("niw_log_predictive/x int", lambda: N.niw_log_predictive(torch.ones(1, 2, dtype=torch.long),
                                                                 post))
    r5("niw_log_predictive/x 1-D", lambda: N.niw_log_predictive(torch.zeros(2, dtype=d64), post))
    r5("niw_log_predictive/1-D equals torch's StudentT", lambda: (
        N.niw_log_predictive(torch.tensor([[0.3]], dtype=d64), N.NIW(
            torch.zeros(1, dtype=d64), 1.0, torch.eye(1, dtype=d64), 3.0)),
        torch.distributions.StudentT(3.0, 0.0, math.sqrt(2.0 / 3.0)).log_prob(
            torch.tensor(0.3, dtype=d64))),
       "ok", lambda o: bool(torch.allclose(o[0][0], o[1])))
    r5("niw_kl/of itself is 0", lambda: N.niw_kl(post, post), "ok", lambda v: abs(v) < 1e-9)
    r5("niw_kl/>= 0", lambda: N.niw_kl(post, niw()), "ok", lambda v: v >= 0)
    for name, S in (("True", True), ("0", 0), ("2.5", 2.5), ("str", "3")):
        r5(f"niw_sample/num_samples {name}", lambda S=S: N.niw_sample(post, S))
    r5("niw_sample/draws are positive definite", lambda: N.niw_sample(
        post, 5, torch.Generator().manual_seed(0))[1], "ok",
       lambda L: bool((torch.diagonal(L, dim1=-2, dim2=-1) > 0).all()))

    # ---- the maths floor: the mixture KL ----------------------------------------------------
    mean, std = torch.zeros(2, 3), torch.ones(2, 3)
    r5("mixture_kl_bound/mean nan", lambda: MX.mixture_kl_bound(mean.clone().fill_(nan), std))
    r5("mixture_kl_bound/std inf", lambda: MX.mixture_kl_bound(mean, std * inf))
    r5("mixture_kl_bound/std nan", lambda: MX.mixture_kl_bound(mean, std * nan))
    r5("mixture_kl_bound/std 0", lambda: MX.mixture_kl_bound(mean, std * 0))
    r5("mixture_kl_bound/prior_std str", lambda: MX.mixture_kl_bound(mean, std, prior_std="1"))
    r5("mixture_kl_bound/prior_mean inf", lambda: MX.mixture_kl_bound(mean, std, prior_mean=inf))
    r5("mixture_kl_bound/at the prior: 0 and -log K", lambda: MX.mixture_kl_bound(
        torch.ones(2, 3), torch.ones(2, 3)), "ok",
       lambda o: abs(float(o[0])) < 1e-6 and abs(float(o[1]) + math.log(2)) < 1e-6)
    r5("mixture_log_prob/theta wrong D", lambda: MX.mixture_log_prob(torch.zeros(4, 5), mean, std))
    r5("mixture_log_prob/one component = Normal", lambda: (
        MX.mixture_log_prob(torch.full((1, 3), 0.5), torch.zeros(1, 3), torch.ones(1, 3)),
        torch.distributions.Normal(0.0, 1.0).log_prob(torch.tensor(0.5)) * 3),
       "ok", lambda o: bool(torch.allclose(o[0], o[1])))

    # ---- the maths floor: the GP maths ------------------------------------------------------
    xg, zg, two = torch.randn(2, 3, 4), torch.randn(2, 5, 4), torch.ones(2)
    r5("gp/whitened_projection x nan", lambda: G.whitened_projection(
        xg.clone().fill_(nan), zg, two, two))
    r5("gp/whitened_projection inducing nan", lambda: G.whitened_projection(
        xg, zg.clone().fill_(nan), two, two))
    r5("gp/whitened_projection lengthscale (3,) for G=2", lambda: G.whitened_projection(
        xg, zg, torch.ones(3), two))
    r5("gp/whitened_projection outputscale (2, 2)", lambda: G.whitened_projection(
        xg, zg, two, torch.ones(2, 2)))
    r5("gp/whitened_projection D mismatch", lambda: G.whitened_projection(
        torch.randn(2, 3, 6), zg, two, two))
    r5("gp/whitened_projection G mismatch", lambda: G.whitened_projection(
        torch.randn(3, 3, 4), zg, two, two))
    r5("gp/whitened_projection int x", lambda: G.whitened_projection(
        torch.ones(2, 3, 4, dtype=torch.long), zg, two, two))
    r5("gp/whitened_projection float scales", lambda: (
        G.whitened_projection(xg, zg, 0.7, 1.3)[0],
        G.whitened_projection(xg, zg, torch.full((2,), 0.7), torch.full((2,), 1.3))[0]),
       "ok", lambda o: bool(torch.equal(o[0], o[1])))
    r5("gp/rbf feature sizes differ", lambda: G.rbf_covariance(torch.randn(3, 4),
                                                                torch.randn(5, 6), 1.0, 1.0))
    r5("gp/rbf lengthscale str", lambda: G.rbf_covariance(torch.randn(3, 4), torch.randn(5, 4),
                                                          "1", 1.0))
    r5("gp/rbf lengthscale bool", lambda: G.rbf_covariance(torch.randn(3, 4), torch.randn(5, 4),
                                                           True, 1.0))
    r5("gp/rbf python floats = closed form", lambda: G.rbf_covariance(
        torch.zeros(1, 2), torch.tensor([[3.0, 4.0]]), 2.0, 1.5), "ok",
       lambda c: abs(float(c) - 1.5 * math.exp(-25 / 8)) < 1e-6)
    r5("gp/matern lengthscale (3,) for (2, ...) points", lambda: G.matern52_covariance(
        xg, zg, torch.ones(3), two))
    a, r = G.whitened_projection(xg, zg, two, two)
    r5("gp/marginals q_mean wrong M", lambda: G.sparse_gp_marginals(
        a, r, torch.zeros(2, 3, 4), torch.eye(5).expand(2, 5, 5)))
    r5("gp/marginals q_mean wrong G", lambda: G.sparse_gp_marginals(
        a, r, torch.zeros(3, 3, 5), torch.eye(5).expand(2, 5, 5)))
    r5("gp/marginals tril wrong M", lambda: G.sparse_gp_marginals(
        a, r, torch.zeros(2, 3, 5), torch.eye(4).expand(2, 4, 4)))
    r5("gp/marginals r wrong shape", lambda: G.sparse_gp_marginals(
        a, r[..., :1], torch.zeros(2, 3, 5), torch.eye(5).expand(2, 5, 5)))
    r5("gp/variance <= prior outputscale", lambda: G.sparse_gp_marginals(
        a, r, torch.zeros(2, 1, 5), torch.zeros(2, 5, 5))[1], "ok",
       lambda v: bool((v <= 1.0 + 1e-5).all()) and bool((v >= 0).all()))
    r5("gp/rff weight D mismatch", lambda: G.random_fourier_features(
        torch.randn(3, 4), torch.randn(8, 5), torch.zeros(8), 1.0, 1.0))
    r5("gp/rff phase wrong length", lambda: G.random_fourier_features(
        torch.randn(3, 4), torch.randn(8, 4), torch.zeros(7), 1.0, 1.0))
    r5("gp/rff float scales", lambda: G.random_fourier_features(
        torch.randn(3, 4), torch.randn(8, 4), torch.zeros(8), 0.5, 2.0), "ok",
       lambda f: f.shape == (3, 8))

    # ---- eval modes: an explicit request draws ------------------------------------------------
    small = dict(d_model=8, nhead=2, num_layers=1, dim_feedforward=16)

    def clf(mode="eval", family="dirichlet"):
        torch.manual_seed(0)
        net = ba.TransformerClassifier(2, vocab_size=6, attention=family, **small)
        return getattr(net, mode)()

    xt = torch.randint(1, 6, (3, 5))

    def differ(o):
        return o.shape[0] == 3 and bool((o[0] - o[1]).abs().max() > 1e-6)

    def no_grad(fn):
        with torch.no_grad():
            return fn()

    r5("eval/num_samples=3 draws", lambda: no_grad(lambda: clf()(xt, num_samples=3)), "ok",
       differ)
    r5("eval/num_samples(3) context draws", lambda: no_grad(lambda: _with_samples(
        3, lambda: clf()(xt))), "ok", differ)
    r5("eval/no request: the mean", lambda: no_grad(lambda: (clf()(xt), clf()(xt))), "ok",
       lambda o: bool(torch.equal(o[0], o[1])))
    r5("eval/mode mean wins over num_samples", lambda: no_grad(lambda: _in_mode(
        "mean", lambda: clf()(xt, num_samples=2))), "ok", lambda o: bool(torch.equal(o[0], o[1])))
    r5("eval/train mode num_samples draws", lambda: no_grad(lambda: clf("train")(
        xt, num_samples=3)), "ok", differ)
    r5("eval/no family: copies", lambda: no_grad(lambda: clf(family=None)(xt, num_samples=3)),
       "ok", lambda o: bool(torch.equal(o[0], o[2])))
    r5("eval/num_samples 0", lambda: clf()(xt, num_samples=0))
    r5("eval/num_samples True", lambda: clf()(xt, num_samples=True))
    r5("eval/num_samples 2.0", lambda: clf()(xt, num_samples=2.0))

    def vit_draws():
        torch.manual_seed(0)
        net = ba.VisionTransformer(2, image_size=8, patch_size=4, in_channels=1,
                                   attention="dirichlet", **small).eval()  # fmt: skip
        with torch.no_grad():
            return net(torch.randn(2, 1, 8, 8), num_samples=3)
    r5("eval/vision transformer num_samples=3 draws", vit_draws, "either", differ)
    from bayesattn.nn.read import AttentionRead

    for name, kw in (("mode bogus", dict(mode="bogus")), ("mode None", dict(mode=None)),
                     ("dropout_p 1.5", dict(mode="mean", dropout_p=1.5)),
                     ("dropout_p -0.1", dict(mode="mean", dropout_p=-0.1)),
                     ("dropout_p nan", dict(mode="mean", dropout_p=nan)),
                     ("num_samples 0", dict(mode="mean", num_samples=0)),
                     ("num_samples 2.0", dict(mode="mean", num_samples=2.0)),
                     ("site 3", dict(mode="mean", site=3)),
                     ("record 'yes'", dict(mode="mean", record="yes"))):  # fmt: skip
        r5(f"AttentionRead/{name}", lambda kw=kw: AttentionRead(None, **kw))
    r5("AttentionRead/family a name", lambda: AttentionRead("dirichlet", "guide"))

    # ---- saving and loading -----------------------------------------------------------------
    def state_round_trip():
        net = clf()
        buf = io.BytesIO()
        torch.save(net.state_dict(), buf)
        buf.seek(0)
        fresh = ba.TransformerClassifier(2, vocab_size=6, attention="dirichlet", **small).eval()
        fresh.load_state_dict(torch.load(buf, weights_only=True))
        with torch.no_grad():
            return net(xt), fresh(xt)
    r5("save/state_dict weights_only round trip", state_round_trip, "ok",
       lambda o: bool(torch.equal(o[0], o[1])))

    def pickled_layer():
        m = M(8, 2, batch_first=True, family="dirichlet",
              support=NS.LocalGlobalSupport(window=2, global_tokens={3, 0})).eval()
        buf = io.BytesIO()
        torch.save(m, buf)
        buf.seek(0)
        back = torch.load(buf, weights_only=False)
        x = torch.randn(2, 6, 8)
        with torch.no_grad():
            return m(x, x, x)[0], back(x, x, x)[0]
    r5("save/pickled local+global layer", pickled_layer, "ok",
       lambda o: bool(torch.equal(o[0], o[1])))

    # ---- Hugging Face conversion -------------------------------------------------------------
    try:
        import transformers
    except ImportError:  # pragma: no cover - the hf extra is installed in CI
        transformers = None
    if transformers is not None:
        from bayesattn.families import DirichletWeights
        from bayesattn.interop.hf import convert_hf, unconvert_hf

        def bert():
            cfg = transformers.BertConfig(hidden_size=16, num_hidden_layers=2,
                                          num_attention_heads=2, intermediate_size=32,
                                          vocab_size=20, attn_implementation="eager")  # fmt: skip
            return transformers.BertModel(cfg).eval()

        ids = {"input_ids": torch.randint(0, 20, (2, 5))}

        def unchanged_after(fn):
            def run():
                b = bert()
                names = [n for n, _ in b.named_parameters()]
                try:
                    fn(b)
                finally:
                    after = [n for n, _ in b.named_parameters()]
                    if after != names or b.config._attn_implementation != "eager":
                        return "changed"  # noqa: B012 - a half-done conversion is silent
            return run

        r5("hf/family of 3 heads on 2", unchanged_after(lambda b: convert_hf(
            b, family=DirichletWeights(3))))
        r5("hf/family of 1 head is shared", lambda: convert_hf(
            bert(), family=DirichletWeights(1)).config._attn_implementation, "ok",
           lambda v: v == "bayesattn")

        class Nothing(ba.families.AttentionFamily):
            pass
        r5("hf/family implementing nothing", unchanged_after(lambda b: convert_hf(
            b, family=Nothing(2))))
        r5("hf/family an int", unchanged_after(lambda b: convert_hf(b, family=3)))
        r5("hf/layers out of range", unchanged_after(lambda b: convert_hf(
            b, family="dirichlet", layers=[5])))

        def twice():
            b = convert_hf(bert(), family="dirichlet")
            convert_hf(b, family="weibull")
            fams = {type(m.bayesattn_family).__name__ for m in b.modules()
                    if hasattr(m, "bayesattn_family")}  # fmt: skip
            return fams
        r5("hf/converting twice takes the second family", twice, "ok",
           lambda f: f == {"WeibullWeights"})

        def pickled_bert():
            b = convert_hf(bert(), family="dirichlet")
            buf = io.BytesIO()
            torch.save(b, buf)
            buf.seek(0)
            back = torch.load(buf, weights_only=False)
            with torch.no_grad():
                return b(**ids).last_hidden_state, back(**ids).last_hidden_state
        r5("hf/pickled converted BERT runs", pickled_bert, "ok",
           lambda o: bool(torch.allclose(o[0], o[1], atol=1e-6)))

        def deep_copied():
            b = convert_hf(bert(), family="dirichlet")
            c = copy.deepcopy(b)
            with torch.no_grad():
                return b(**ids).last_hidden_state, c(**ids).last_hidden_state
        r5("hf/deep-copied converted BERT", deep_copied, "ok",
           lambda o: bool(torch.allclose(o[0], o[1], atol=1e-6)))

        def unconverted_state():
            b = unconvert_hf(convert_hf(bert(), family="dirichlet"))
            return sorted(k for k in vars(b) if k.startswith("_bayesattn"))
        r5("hf/unconvert leaves no conversion state", unconverted_state, "ok",
           lambda keys: keys == [])

        def draws_in_eval():
            b = convert_hf(bert(), family="dirichlet")
            with torch.no_grad():
                return _with_samples(3, lambda: b(**ids).last_hidden_state)
        r5("hf/num_samples(3) draws in eval", draws_in_eval, "ok", differ)

    def convert_again():
        import pyro

        from bayesattn.families import DirichletWeights

        pyro.clear_param_store()
        m = torch.nn.Sequential(torch.nn.MultiheadAttention(8, 2, batch_first=True))
        ba.convert(m, family=DirichletWeights(2, init_concentration=1.0))
        x = torch.randn(2, 5, 8)
        pyro.poutine.trace(m[0]).get_trace(x, x, x)
        ba.convert(m, family=DirichletWeights(2, init_concentration=50.0))
        pyro.poutine.trace(m[0]).get_trace(x, x, x)
        out = pyro.param("0.family$$$log_concentration").detach().clone()
        pyro.clear_param_store()
        return out
    r5("convert/again: the param store takes the new family", convert_again, "ok",
       lambda v: bool(torch.allclose(v, torch.full((2,), math.log(50.0)))))

    # ---- the newest supports' edges --------------------------------------------------------
    x6 = torch.randn(2, 6, 8)
    pad = torch.zeros(2, 6, dtype=torch.bool)
    pad[1, 4:] = True
    for kname, kern in (("cluster_topk", NS.ClusterTopKSupport(k=3, num_clusters=2)),
                        ("lowrank", NS.LowRankSupport(rank=3, max_len=8))):  # fmt: skip
        r5(f"{kname}/soft float padding 1.0", lambda kern=kern: M(
            8, 2, batch_first=True, support=kern)(x6, x6, x6, key_padding_mask=pad.float()))
        r5(f"{kname}/int padding mask", lambda kern=kern: M(
            8, 2, batch_first=True, support=kern)(x6, x6, x6, key_padding_mask=pad.long()))
    for fam in (None, "dirichlet"):
        r5(f"cluster_topk/empty batch family={fam}", lambda fam=fam: M(
            8, 2, batch_first=True, family=fam, support=NS.ClusterTopKSupport(k=3))(
            *(torch.randn(0, 6, 8),) * 3)[0], "ok", lambda o: o.shape == (0, 6, 8))
    r5("local_global/global tokens unsorted with a repeat", lambda: NS.LocalGlobalSupport(
        window=2, global_tokens=(3, 1, 3)).global_tokens, "ok", lambda t: t == (1, 3))
    r5("local_global/global tokens a set equals dense", _pair_local_global, "ok",
       lambda o: bool(torch.allclose(o[0], o[1], atol=1e-5)))

    # ---- fit and Predictive on foreign, ragged or shapeless models --------------------------
    from bayesattn.training import fit

    lin = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    xf = torch.randn(8, 4)
    r5("fit foreign/labels >= C", lambda: fit(copy.deepcopy(lin), (
        xf, torch.tensor([0, 1, 2, 3, 0, 1, 2, 0])), epochs=1, batch_size=8, progress=False))

    class Ragged(torch.utils.data.Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return torch.randint(1, 6, (3 + i,)), i % 2
    r5("fit/ragged dataset through a DataLoader", lambda: fit(clf("train"), torch.utils.data
       .DataLoader(Ragged(), batch_size=2), epochs=1, progress=False))
    r5("fit/meta-device network", lambda: fit(clf("train").to("meta"), (
        xt, torch.tensor([0, 1, 0])), epochs=1, batch_size=3, progress=False))
    r5("fit/meta-device foreign model", lambda: fit(copy.deepcopy(lin).to("meta"), (
        xf, torch.zeros(8, dtype=torch.long)), epochs=1, batch_size=8, progress=False))
    r5("Predictive/forward=3", lambda: Predictive(lin, 2, forward=3))
    r5("Predictive/forward a str", lambda: Predictive(lin, 2, forward="logits"))
    r5("Predictive/meta-device foreign model", lambda: Predictive(
        copy.deepcopy(lin).to("meta"), 2)(xf))
    r5("register_family/implements nothing", lambda: ba.register_family(
        "r5_nothing", type("R5Nothing", (ba.families.AttentionFamily,), {})))
    r5("layer/family implementing nothing", lambda: M(8, 2, family=type(
        "R5Nothing", (ba.families.AttentionFamily,), {})(2)))

    def changed_corpus():
        from bayesattn.data.fortunes import FORTUNE_TOPICS, read_fortunes

        root = Path(tmpdir) / "r5-fortunes"
        root.mkdir(exist_ok=True)
        for t in FORTUNE_TOPICS:
            (root / t).write_text("one entry\n%\n")
        first = len(read_fortunes(root)[0])
        (root / "art").write_text("a\n%\nb\n%\nc\n%\n")
        return first, len(read_fortunes(root)[0])
    r5("read_fortunes/changed corpus is read again", changed_corpus, "ok",
       lambda o: o == (10, 12))


def _pair_local_global():
    """A dense layer and the same layer with local + global attention whose window covers
    every key and whose global tokens come as a set: equal outputs."""
    import bayesattn as ba
    from bayesattn.nn import supports as NS

    torch.manual_seed(0)
    dense = ba.BayesianMultiheadAttention(8, 2, batch_first=True).eval()
    m = ba.BayesianMultiheadAttention(8, 2, batch_first=True, support=NS.LocalGlobalSupport(
        window=8, global_tokens={2, 0})).eval()
    m.load_state_dict(dense.state_dict(), strict=False)
    x = torch.randn(2, 6, 8)
    with torch.no_grad():
        return m(x, x, x)[0], dense(x, x, x)[0]


def _with_samples(S, fn):
    import bayesattn

    with bayesattn.num_samples(S):
        return fn()


def _in_mode(mode, fn):
    from bayesattn.nn import attention_mode

    with attention_mode(mode):
        return fn()


def run(verbose: bool = True, prefix: str = "") -> dict[str, list[tuple[str, str]]]:
    """Classify every case (whose name starts with ``prefix``); returns ``{outcome: [(name,
    detail), ...]}``."""
    torch.set_num_threads(1)
    out: dict[str, list[tuple[str, str]]] = {"clear": [], "ok": [], "obscure": [], "silent": []}
    for case in _cases():
        if not case.name.startswith(prefix):
            continue
        torch.manual_seed(0)
        outcome, detail = classify(case)
        out[outcome].append((case.name, detail))
    if verbose:
        for cls in ("silent", "obscure"):
            for name, detail in out[cls]:
                print(f"{cls:8s} {name}: {detail[:300]}")
        total = sum(len(v) for v in out.values())
        print(
            f"\n{total} cases: {len(out['clear'])} clear error, {len(out['ok'])} ok, "
            f"{len(out['obscure'])} obscure error, {len(out['silent'])} silent wrong"
        )
    return out


def by_surface(out: dict[str, list[tuple[str, str]]]) -> dict[str, dict[str, int]]:
    """Counts per outcome for each surface (a case name up to its first ``/``)."""
    table: dict[str, dict[str, int]] = {}
    for outcome, rows in out.items():
        for name, _ in rows:
            row = table.setdefault(name.split("/")[0], dict.fromkeys(out, 0))
            row[outcome] += 1
    return table


if __name__ == "__main__":
    import sys

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    result = run(prefix=sys.argv[1] if len(sys.argv) > 1 else "")
    if len(sys.argv) > 1:
        for surface, row in sorted(by_surface(result).items()):
            print(f"{surface:40s} " + " ".join(f"{k} {v}" for k, v in row.items()))
