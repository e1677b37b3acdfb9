"""Tests of bayesattn.models: Pyro's enumeration, SVI and closed forms against each other."""

from __future__ import annotations

import math

import pyro
import pyro.distributions as dist
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from pyro import poutine
from pyro.infer import config_enumerate

from bayesattn import functional as F
from bayesattn import models as M
from bayesattn.priors import (
    CausalPrior,
    ContextualPrior,
    DistanceDecayPrior,
    LearnedPrior,
    LocalWindowPrior,
    UniformPrior,
)

DT = torch.float64


@pytest.fixture(autouse=True)
def _clean_pyro():
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    yield
    pyro.clear_param_store()


def _qk(b: int, h: int, tq: int, tk: int, d: int, seed: int = 0, c: float = 1.0):
    g = torch.Generator().manual_seed(seed)
    q = c * torch.randn(b, h, tq, d, generator=g, dtype=DT)  # (B, H, Tq, D)
    k = c * torch.randn(b, h, tk, d, generator=g, dtype=DT)  # (B, H, Tk, D)
    return q, k


def _reference(q, k, log_prior=None):
    return F.posterior_weights(F.attention_logits(q, k), log_prior)  # (B, H, Tq, Tk)


def _reference_evidence(q, k, log_prior=None):
    s = F.attention_logits(q, k)  # (B, H, Tq, Tk)
    lp = torch.zeros_like(s) if log_prior is None else log_prior.to(DT).expand_as(s)
    log_pi = lp - torch.logsumexp(lp, -1, keepdim=True)
    return torch.logsumexp(log_pi + s, -1).sum()


# ------------------------------------------------------------------------------------------------
# the model's structure
# ------------------------------------------------------------------------------------------------


def test_model_sites_plates_and_shapes():
    q, k = _qk(2, 3, 4, 5, 6)
    tr = poutine.trace(M.attention_model).get_trace(q, k)
    z = tr.nodes["z"]
    assert z["value"].shape == (2, 3, 4)
    assert isinstance(z["fn"], dist.Categorical)
    frames = {f.name: (f.dim, f.size) for f in z["cond_indep_stack"]}
    assert frames == {"batch": (-3, 2), "heads": (-2, 3), "queries": (-1, 4)}
    lik = tr.nodes["lik"]
    s = F.attention_logits(q, k)
    want = s.gather(-1, z["value"].unsqueeze(-1)).squeeze(-1)  # (B, H, Tq)
    torch.testing.assert_close(lik["fn"].log_factor, want)


def test_model_likelihood_broadcasts_under_enumeration():
    q, k = _qk(2, 3, 4, 5, 6)
    model = config_enumerate(M.attention_model, default="parallel")
    tr = poutine.trace(poutine.enum(model, first_available_dim=-4)).get_trace(q, k)
    z = tr.nodes["z"]["value"]
    assert z.shape == (5, 1, 1, 1)
    lik = tr.nodes["lik"]["fn"].log_factor  # (Tk, B, H, Tq)
    assert lik.shape == (5, 2, 3, 4)
    torch.testing.assert_close(lik, F.attention_logits(q, k).permute(3, 0, 1, 2))


def test_model_prior_is_normalised_and_keeps_masks():
    q, k = _qk(1, 2, 3, 4, 5)
    lp = torch.tensor([0.0, 3.0, float("-inf"), -1.0], dtype=DT)
    fn = poutine.trace(M.attention_model).get_trace(q, k, lp).nodes["z"]["fn"]
    probs = fn.probs  # (B, H, Tq, Tk)
    torch.testing.assert_close(probs.sum(-1), torch.ones(1, 2, 3, dtype=DT))
    assert (probs[..., 2] == 0).all()
    torch.testing.assert_close(probs[0, 0, 0], torch.softmax(lp, -1))


# ------------------------------------------------------------------------------------------------
# exact posterior and evidence by enumeration
# ------------------------------------------------------------------------------------------------


@settings(max_examples=25, deadline=None)
@given(
    b=st.integers(1, 3),
    h=st.integers(1, 3),
    tq=st.integers(1, 4),
    tk=st.integers(1, 5),
    d=st.integers(1, 4),
    seed=st.integers(0, 2**16),
)
def test_exact_posterior_matches_softmax(b, h, tq, tk, d, seed):
    q, k = _qk(b, h, tq, tk, d, seed, c=2.0)
    post = M.exact_posterior(q, k)
    assert post.shape == (b, h, tq, tk)
    torch.testing.assert_close(post, _reference(q, k), atol=1e-6, rtol=0)
    ev = M.exact_evidence(q, k)
    torch.testing.assert_close(ev, _reference_evidence(q, k), atol=1e-6, rtol=1e-9)


def _random_learned(h: int) -> LearnedPrior:
    p = LearnedPrior(h, 3)
    with torch.no_grad():
        p.table.copy_(torch.randn(p.table.shape, generator=torch.Generator().manual_seed(3)))
    return p


def _random_contextual(d: int) -> ContextualPrior:
    torch.manual_seed(4)
    return ContextualPrior(d).double()


PRIORS = {
    "uniform": lambda h, d: UniformPrior(),
    "causal": lambda h, d: CausalPrior(),
    "window2": lambda h, d: LocalWindowPrior(2),
    "causal_window2": lambda h, d: LocalWindowPrior(2, causal=True),
    "alibi": lambda h, d: DistanceDecayPrior(h),
    "learned": lambda h, d: _random_learned(h),
    "contextual": lambda h, d: _random_contextual(d),
    "causal+alibi": lambda h, d: CausalPrior() + DistanceDecayPrior(h),
    "window+contextual": lambda h, d: LocalWindowPrior(1) + _random_contextual(d),
}


@pytest.mark.parametrize("name", sorted(PRIORS))
@pytest.mark.parametrize("shape", [(2, 3, 5, 5), (1, 2, 3, 6), (2, 1, 4, 4)])
def test_exact_posterior_every_prior(name, shape):
    b, h, tq, tk = shape
    d = 4
    q, k = _qk(b, h, tq, tk, d, seed=tq * tk, c=1.5)
    prior = PRIORS[name](h, d)
    with torch.no_grad():
        lp = prior(q, k)  # broadcastable to (B, H, Tq, Tk)
    ref = _reference(q, k, lp)
    torch.testing.assert_close(M.exact_posterior(q, k, lp), ref, atol=1e-6, rtol=0)
    # a KeyRelevancePrior module is accepted directly, too
    with torch.no_grad():
        torch.testing.assert_close(M.exact_posterior(q, k, prior), ref, atol=1e-6, rtol=0)
    torch.testing.assert_close(
        M.exact_evidence(q, k, lp), _reference_evidence(q, k, lp), atol=1e-6, rtol=1e-9
    )


@pytest.mark.parametrize("is_causal", [False, True])
def test_exact_posterior_with_padding_mask(is_causal):
    b, h, tq, tk = 3, 2, 4, 6
    q, k = _qk(b, h, tq, tk, 5, seed=7)
    kpm = torch.zeros(b, tk, dtype=torch.bool)
    kpm[0, 4:] = True
    kpm[1, 1] = True
    kpm[2, 2:5] = True  # key 0 always kept, so no row is fully masked under the causal prior
    lp = F.mask_to_log_prior(
        key_padding_mask=kpm,
        is_causal=is_causal,
        batch_size=b,
        num_heads=h,
        tgt_len=tq,
        src_len=tk,
        dtype=DT,
    )
    post = M.exact_posterior(q, k, lp)
    torch.testing.assert_close(post, _reference(q, k, lp), atol=1e-6, rtol=0)
    assert (post[kpm[:, None, None, :].expand_as(post)] == 0).all()  # padded keys: exact zeros
    torch.testing.assert_close(
        M.exact_evidence(q, k, lp), _reference_evidence(q, k, lp), atol=1e-6, rtol=1e-9
    )


def test_exact_posterior_and_evidence_are_differentiable():
    q, k = _qk(2, 2, 3, 4, 5, seed=1)
    q1 = q.clone().requires_grad_()
    q2 = q.clone().requires_grad_()
    w = torch.randn(2, 2, 3, 4, dtype=DT)
    (M.exact_posterior(q1, k) * w).sum().backward()
    (_reference(q2, k) * w).sum().backward()
    torch.testing.assert_close(q1.grad, q2.grad)
    q1.grad = q2.grad = None
    M.exact_evidence(q1, k).backward()
    _reference_evidence(q2, k).backward()
    torch.testing.assert_close(q1.grad, q2.grad)


def test_custom_scale():
    q, k = _qk(2, 2, 3, 4, 5, seed=5)
    ref = F.posterior_weights(F.attention_logits(q, k, 0.3))
    torch.testing.assert_close(M.exact_posterior(q, k, scale=0.3), ref, atol=1e-6, rtol=0)
    ev = torch.logsumexp(F.attention_logits(q, k, 0.3) - math.log(4), -1).sum()
    torch.testing.assert_close(M.exact_evidence(q, k, scale=0.3), ev)


def test_float32_inputs():
    q, k = _qk(2, 2, 3, 4, 5, seed=2)
    q, k = q.float(), k.float()
    post = M.exact_posterior(q, k)
    assert post.dtype == torch.float32
    torch.testing.assert_close(post, _reference(q, k), atol=1e-6, rtol=0)


# ------------------------------------------------------------------------------------------------
# bad input
# ------------------------------------------------------------------------------------------------


def test_fully_masked_row_raises():
    q, k = _qk(1, 1, 3, 3, 2)
    lp = torch.zeros(3, 3, dtype=DT)
    lp[1] = float("-inf")  # query 1 may read no key
    for fn in (M.attention_model, M.exact_posterior, M.exact_evidence, M.fit_categorical_guide):
        with pytest.raises(ValueError, match=r"masks every key.*\(0, 0, 1\)"):
            fn(q, k, lp)


@pytest.mark.parametrize(
    ("q_shape", "k_shape", "match"),
    [
        ((2, 3, 4), (2, 3, 5), r"q must have shape \(B, H, Tq, D\)"),
        ((1, 2, 3, 4), (1, 2, 5, 3), "must share B, H and D"),
        ((1, 2, 3, 4), (2, 2, 5, 4), "must share B, H and D"),
        ((1, 2, 3, 4), (1, 2, 0, 4), "at least one query and one key"),
    ],
)
def test_bad_shapes_raise(q_shape, k_shape, match):
    with pytest.raises(ValueError, match=match):
        M.exact_posterior(torch.randn(q_shape), torch.randn(k_shape))


def test_bad_log_prior_raises():
    q, k = _qk(1, 2, 3, 4, 5)
    with pytest.raises(ValueError, match=r"broadcast to \(B, H, Tq, Tk\) = \(1, 2, 3, 4\)"):
        M.exact_posterior(q, k, torch.zeros(3, 5, dtype=DT))
    with pytest.raises(TypeError, match="mask_to_log_prior"):
        M.exact_posterior(q, k, torch.zeros(3, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="NaN"):
        M.exact_posterior(q, k, torch.full((3, 4), float("nan"), dtype=DT))
    with pytest.raises(TypeError, match="log_prior must be None"):
        M.exact_posterior(q, k, [[0.0] * 4] * 3)
    with pytest.raises(TypeError, match="q must be a torch.Tensor"):
        M.exact_posterior(q.tolist(), k)
    with pytest.raises(ValueError, match="q must be finite"):
        M.exact_posterior(q * float("inf"), k)


# ------------------------------------------------------------------------------------------------
# SVI with a categorical guide
# ------------------------------------------------------------------------------------------------


def test_fit_categorical_guide_matches_exact_posterior():
    b, h, tq, tk = 1, 2, 3, 4
    q, k = _qk(b, h, tq, tk, 5, seed=0)
    # head 0: uniform prior; head 1: causal prior (keys of zero mass must get zero guide mass)
    lp = torch.zeros(b, h, tq, tk, dtype=DT)
    lp[:, 1] = F.causal_log_prior(tq, tk, dtype=DT)
    store = pyro.get_param_store()
    pyro.param("unrelated", torch.ones(2))
    rng = torch.get_rng_state()
    fitted = M.fit_categorical_guide(q, k, lp, num_steps=250, lr=0.1, seed=0)
    assert torch.equal(torch.get_rng_state(), rng)  # the global RNG is untouched
    # The guide enumerates z, so TraceEnum_ELBO is the exact ELBO = log p(q) - KL(q_phi || post):
    # deterministic gradients, and Adam drives the KL to ~0: max error 1.5e-6 after 250 steps
    # (8.5e-8 after 300) in float64 on this case, whose smallest non-zero posterior probability is
    # 1.3e-2 (sharper posteriors converge more slowly). atol 1e-4 leaves a ~70x margin and is still
    # two orders below the smallest probability, so a wrong posterior could not pass.
    torch.testing.assert_close(fitted, M.exact_posterior(q, k, lp), atol=1e-4, rtol=0)
    assert (fitted[(lp == float("-inf"))] == 0).all()
    torch.testing.assert_close(fitted.sum(-1), torch.ones(b, h, tq, dtype=DT))
    # the fit ran in a scoped param store: nothing leaked in, nothing was lost
    assert set(store.keys()) == {"unrelated"}


# ------------------------------------------------------------------------------------------------
# online belief updates
# ------------------------------------------------------------------------------------------------


def _online_data(c: float, seed: int = 0, n: int = 30, tk: int = 4, d: int = 3):
    g = torch.Generator().manual_seed(seed)
    k = c * torch.randn(tk, d, generator=g, dtype=DT)  # (Tk, D)
    q = c * torch.randn(n, d, generator=g, dtype=DT)  # (N, D)
    return q, k


def test_vb_update_is_a_fixed_point_and_adds_n():
    q, k = _online_data(1.5)
    alpha0 = torch.tensor([1.0, 2.0, 0.5, 3.0], dtype=DT)
    belief = M.OnlineKeyRelevance(alpha0=alpha0)
    assert belief.responsibilities is None
    assert belief.update(q, k) is belief
    assert belief.converged
    a, r = belief.alpha, belief.responsibilities
    assert r.shape == (30, 4)
    torch.testing.assert_close(r.sum(-1), torch.ones(30, dtype=DT))
    # total mass grows by exactly N
    assert math.isclose(float(a.sum()), float(alpha0.sum()) + 30, rel_tol=0, abs_tol=1e-10)
    torch.testing.assert_close(a, alpha0 + r.sum(0))
    # r is the coordinate-ascent optimum at the final alpha
    s = F.attention_logits(q, k)
    r_star = torch.softmax(torch.digamma(a) - torch.digamma(a.sum()) + s, -1)
    torch.testing.assert_close(r, r_star, atol=1e-10, rtol=0)
    torch.testing.assert_close(belief.mean, a / a.sum())
    # a second batch starts from the first's posterior
    belief.update(q[:7], k)
    assert math.isclose(float(belief.alpha.sum()), float(a.sum()) + 7, abs_tol=1e-10)
    assert belief.num_queries == 37
    belief.reset()
    torch.testing.assert_close(belief.alpha, alpha0)


def test_zero_queries_carry_no_evidence():
    n, tk = 12, 4
    k = torch.randn(tk, 3, dtype=DT)
    q = torch.zeros(n, 3, dtype=DT)
    # symmetric prior: by symmetry each key gets exactly N/Tk
    sym = M.OnlineKeyRelevance(tk, 2.0, dtype=DT).update(q, k)
    torch.testing.assert_close(sym.alpha, torch.full((tk,), 2.0 + n / tk, dtype=DT))
    # asymmetric prior: alpha' = alpha0 + N softmax(psi(alpha')), which for a large prior is
    # ~ alpha0 + N * mean(alpha0) (psi(a) ~ log(a - 1/2))
    alpha0 = torch.tensor([40.0, 30.0, 20.0, 10.0], dtype=DT)
    b = M.OnlineKeyRelevance(alpha0=alpha0).update(q, k)
    added = b.alpha - alpha0
    torch.testing.assert_close(added, n * torch.softmax(torch.digamma(b.alpha), -1))
    torch.testing.assert_close(added, n * alpha0 / alpha0.sum(), atol=0.05, rtol=0)
    torch.testing.assert_close(b.responsibilities, (added / n).expand(n, tk))


def test_sequential_updates_close_to_batch():
    q, k = _online_data(6.0)
    batch = M.OnlineKeyRelevance(4, dtype=DT).update(q, k)
    seq = M.OnlineKeyRelevance(4, dtype=DT)
    for qi in q:
        seq.update(qi, k)  # a single (D,) query
    assert seq.num_queries == 30
    torch.testing.assert_close(seq.alpha.sum(), batch.alpha.sum())
    # Sequential filtering and the batch fixed point differ only through how early queries
    # see later evidence; with sharp responsibilities (mean max r ~ 0.97 here) the seeded run
    # gives max |d alpha| = 0.15 of 34 and max |d mean| = 0.005 (with diffuse responsibilities,
    # c = 1.5, the gap grows to 2.3 and 0.07: batch VB's self-reinforcement is stronger).
    torch.testing.assert_close(seq.alpha, batch.alpha, atol=0.3, rtol=0)
    torch.testing.assert_close(seq.mean, batch.mean, atol=0.01, rtol=0)


def test_relevance_model_structure():
    q, k = _online_data(1.0, n=5)
    tr = poutine.trace(M.relevance_model).get_trace(q, k, 2.0)
    assert tr.nodes["pi"]["value"].shape == (4,)
    assert tr.nodes["z"]["value"].shape == (5,)
    assert tr.nodes["z"]["infer"]["enumerate"] == "parallel"
    # z marginalised: the ELBO with a delta guide at pi is log Dir(pi) + sum_i log sum_j pi_j e^s
    pi = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=DT)
    elbo = pyro.infer.TraceEnum_ELBO(max_plate_nesting=1)
    cond = poutine.condition(M.relevance_model, data={"pi": pi})
    got = -elbo.loss(cond, lambda *a, **kw: None, q, k, 2.0)
    s = F.attention_logits(q, k)
    want = dist.Dirichlet(torch.full((4,), 2.0, dtype=DT)).log_prob(pi)
    want = want + torch.logsumexp(pi.log() + s, -1).sum()
    assert math.isclose(got, float(want), rel_tol=1e-10)


def test_svi_dirichlet_matches_vb_when_responsibilities_are_sharp():
    q, k = _online_data(6.0)
    vb = M.OnlineKeyRelevance(4, dtype=DT).update(q, k)
    assert float(vb.responsibilities.max(-1).values.mean()) > 0.95
    beta = M.fit_relevance_guide(q, k, 1.0, num_steps=250, lr=0.15, num_particles=8, seed=0)
    prior_mean = torch.full((4,), 0.25, dtype=DT)
    svi_mean = beta / beta.sum()
    # Mean-field VB keeps q(z) apart from q(pi) and credits every query as one full count
    # (total alpha = 4 + 30 = 34 exactly); SVI fits Dirichlet(beta) to the collapsed posterior
    # p(pi | q) with z summed out, which also accounts for the residual ambiguity of each query,
    # so it is a little less concentrated. Seeded run: max |mean diff| = 0.001, total 31.9 vs 34
    # (-6%; importance sampling of the collapsed posterior gives 32.0, so the gap is VB's, not
    # SVI's). Tolerances: 0.02 on the means, 10% on the totals; over seeds 0-4 the SVI total
    # ranges 31.1-32.2 and the max mean diff 0.0001-0.0054, so neither is close to its bound.
    torch.testing.assert_close(svi_mean, vb.mean, atol=0.02, rtol=0)
    assert abs(float(beta.sum()) / float(vb.alpha.sum()) - 1.0) < 0.10
    assert float(beta.sum()) <= float(vb.alpha.sum())  # VB is the more confident one
    # ... and SVI is much closer to VB than to the prior (Dir(1,1,1,1), total 4)
    d_vb = float((svi_mean - vb.mean).abs().max())
    d_prior = float((svi_mean - prior_mean).abs().max())
    assert d_vb < 0.1 * d_prior
    assert abs(float(beta.sum() - vb.alpha.sum())) < 0.2 * abs(float(beta.sum()) - 4.0)


def test_vb_is_overconfident_when_responsibilities_are_diffuse():
    """With ambiguous queries the means still agree but VB's total concentration (always
    alpha0 + N) overstates the evidence; SVI on the collapsed model tracks the truth, estimated
    here by self-normalised importance sampling (a third, independent computation)."""
    q, k = _online_data(1.5)
    vb = M.OnlineKeyRelevance(4, dtype=DT).update(q, k)
    beta = M.fit_relevance_guide(q, k, 1.0, num_steps=250, lr=0.15, num_particles=8, seed=0)
    # importance sampling of p(pi | q) = Dir(pi; 1) prod_i sum_j pi_j e^{s_ij}
    proposal = dist.Dirichlet(0.4 * vb.alpha)  # wider than the posterior
    torch.manual_seed(0)
    pi = proposal.sample((40_000,))  # (S, Tk)
    s = F.attention_logits(q, k)  # (N, Tk)
    logw = torch.logsumexp(pi.log()[:, None, :] + s, -1).sum(-1) - proposal.log_prob(pi)
    w = torch.softmax(logw, 0)  # (S,); the flat prior Dir(1) is a constant
    assert 1.0 / float((w**2).sum()) > 10_000  # effective sample size
    m = (w[:, None] * pi).sum(0)  # posterior mean, (Tk,)
    v = (w[:, None] * (pi - m) ** 2).sum(0)
    total = float((m * (1 - m) / v - 1).mean())  # moment-matched Dirichlet concentration
    # Seeded run: VB total 34, SVI 15.5, IS 15.9 (ESS 29k); max |mean diff| SVI-VB 0.010,
    # SVI-IS 0.011, VB-IS 0.020. Tolerances: 0.02 (SVI-IS means), 0.03 (SVI-VB means: VB's own
    # mean is biased here; over seeds 0-4 SVI-VB reaches 0.021), 15% on the SVI vs IS totals
    # (SVI totals 14.9-15.5 over seeds 0-4), and VB total > 1.8x SVI's.
    assert float(vb.alpha.sum()) > 1.8 * float(beta.sum())
    assert abs(float(beta.sum()) / total - 1.0) < 0.15
    torch.testing.assert_close(beta / beta.sum(), m, atol=0.02, rtol=0)
    torch.testing.assert_close(beta / beta.sum(), vb.mean, atol=0.03, rtol=0)


def test_online_bad_input_raises():
    with pytest.raises(ValueError, match="alpha0 must be finite and > 0"):
        M.OnlineKeyRelevance(3, 0.0)
    with pytest.raises(ValueError, match=r"alpha0 must have shape \(3,\)"):
        M.OnlineKeyRelevance(3, torch.ones(4))
    with pytest.raises(ValueError, match="num_keys is required"):
        M.OnlineKeyRelevance(None, 1.0)
    belief = M.OnlineKeyRelevance(3)
    with pytest.raises(ValueError, match=r"k must have shape \(3, D\); got \(4, 2\)"):
        belief.update(torch.randn(5, 2), torch.randn(4, 2))
    with pytest.raises(ValueError, match="must share D"):
        belief.update(torch.randn(5, 3), torch.randn(3, 2))
    with pytest.raises(ValueError, match=r"q must have shape \(N, D\)"):
        belief.update(torch.randn(2, 5, 2), torch.randn(3, 2))


def test_fit_categorical_guide_needs_a_step():
    q, k = torch.randn(1, 1, 2, 3), torch.randn(1, 1, 3, 3)
    with pytest.raises(ValueError, match="num_steps must be a positive int"):
        M.fit_categorical_guide(q, k, num_steps=0)
