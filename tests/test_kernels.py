"""Efficient kernels over a reduced key support, checked against dense attention.

Independent references: dense attention under a hard ``LocalWindowPrior`` (local), dense attention
(top-k with k = T), dense attention under the log-prior that restricts each query to its top-k keys
(top-k), dense attention over explicitly projected keys/values (low rank), and every posterior
family's dense distribution with the same restriction (same log-densities and KLs).
"""

from __future__ import annotations

import pyro
import pytest
import torch
from torch import nn

from bayesattn import BayesianMultiheadAttention, LocalWindowPrior, attention_mode, collect_kl
from bayesattn import functional as BF
from bayesattn.families import get_family
from bayesattn.kernels import (
    SupportWeights,
    chunk_log_prior,
    dense_support_mask,
    local_attention,
    local_support,
    lowrank_project,
    lowrank_support,
    support_attend,
    topk_support,
)
from bayesattn.nn.blocks import AttentionConfig
from bayesattn.nn.kernels import LocalKernel, LowRankKernel, TopKKernel, get_kernel
from bayesattn.nn.networks import TransformerClassifier
from bayesattn.priors import DistanceDecayPrior

FAMILIES = ["dirichlet", "logistic_normal", "weibull", "concrete"]


def qkv(B=2, H=3, Tq=37, Tk=37, D=8, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, Tq, D, generator=g, dtype=dtype)
    k = torch.randn(B, H, Tk, D, generator=g, dtype=dtype)
    v = torch.randn(B, H, Tk, D, generator=g, dtype=dtype)
    return q, k, v


def masks(B, H, T, causal):
    kpm = torch.zeros(B, T, dtype=torch.bool)
    kpm[0, -7:] = True
    dense = BF.mask_to_log_prior(
        None, kpm, causal, batch_size=B, num_heads=H, tgt_len=T, src_len=T, dtype=torch.float64
    )
    fn = chunk_log_prior(
        None, kpm, causal, batch_size=B, num_heads=H, tgt_len=T, src_len=T, dtype=torch.float64
    )
    return dense, fn


# ---------------------------------------------------------------------------------- local
@pytest.mark.parametrize("window", [0, 1, 4, 50])
@pytest.mark.parametrize("chunk", [5, None])
def test_local_equals_dense_under_window_prior(window, chunk):
    q, k, v = qkv()
    out_d, w_d = BF.attention(q, k, v, LocalWindowPrior(window)(q, k))
    s = local_support(q, k, window, chunk_size=chunk)
    assert s.logits.shape == (2, 3, 37, 2 * window + 1)
    w = s.posterior_weights()
    torch.testing.assert_close(SupportWeights(w, s.index, 37).to_dense(), w_d, atol=1e-6, rtol=0)
    torch.testing.assert_close(support_attend(w, s, v, chunk_size=chunk), out_d, atol=1e-6, rtol=0)
    out_f = local_attention(q, k, v, window, chunk_size=chunk)
    torch.testing.assert_close(out_f, out_d, atol=1e-6, rtol=0)


@pytest.mark.parametrize("causal", [False, True])
def test_local_with_padding_causal_and_cross_lengths(causal):
    q, k, v = qkv()
    dense, fn = masks(2, 3, 37, causal)
    lp = dense + LocalWindowPrior(3)(q, k)
    out_d, _ = BF.attention(q, k, v, lp)
    s = local_support(q, k, 3, fn, chunk_size=8)
    torch.testing.assert_close(
        support_attend(s.posterior_weights(), s, v), out_d, atol=1e-6, rtol=0
    )
    torch.testing.assert_close(
        local_attention(q, k, v, 3, fn, chunk_size=6), out_d, atol=1e-6, rtol=0
    )
    # Tq != Tk (cross attention by position)
    q2, k2, v2 = qkv(Tq=20, Tk=31, seed=1)
    out_d, _ = BF.attention(q2, k2, v2, LocalWindowPrior(4)(q2, k2))
    torch.testing.assert_close(
        local_attention(q2, k2, v2, 4, chunk_size=7), out_d, atol=1e-6, rtol=0
    )
    s = local_support(q2, k2, 4, chunk_size=7)
    torch.testing.assert_close(
        support_attend(s.posterior_weights(), s, v2), out_d, atol=1e-6, rtol=0
    )


def test_local_gradients_match_dense():
    q, k, v = qkv(Tq=19, Tk=19)
    ref = [t.clone().requires_grad_() for t in (q, k, v)]
    mine = [t.clone().requires_grad_() for t in (q, k, v)]
    BF.attention(*ref, LocalWindowPrior(2)(ref[0], ref[1]))[0].square().sum().backward()
    s = local_support(mine[0], mine[1], 2, chunk_size=4)
    support_attend(s.posterior_weights(), s, mine[2]).square().sum().backward()
    for a, b in zip(ref, mine, strict=True):
        torch.testing.assert_close(b.grad, a.grad, atol=1e-10, rtol=0)


def test_layer_local_kernel_equals_dense_layer_with_window_prior():
    torch.manual_seed(0)
    x = torch.randn(2, 30, 16, dtype=torch.float64)
    dense = BayesianMultiheadAttention(16, 4, batch_first=True, prior=LocalWindowPrior(3)).double()
    loc = BayesianMultiheadAttention(16, 4, batch_first=True, kernel=LocalKernel(3, 8)).double()
    loc.load_state_dict(dense.state_dict())
    y_d, w_d = dense(x, x, x, average_attn_weights=False)
    y_l, w_l = loc(x, x, x, average_attn_weights=False)
    torch.testing.assert_close(y_l, y_d, atol=1e-6, rtol=0)
    torch.testing.assert_close(w_l.to_dense(), w_d, atol=1e-6, rtol=0)
    torch.testing.assert_close(loc(x, x, x, need_weights=False)[0], y_d, atol=1e-6, rtol=0)
    torch.testing.assert_close(loc(x, x, x)[1].to_dense(), dense(x, x, x)[1], atol=1e-6, rtol=0)
    # a positional prior is applied within the band
    alibi = DistanceDecayPrior(4)
    d2 = BayesianMultiheadAttention(16, 4, batch_first=True, prior=LocalWindowPrior(3) + alibi)
    l2 = BayesianMultiheadAttention(16, 4, batch_first=True, prior=alibi, kernel=LocalKernel(3, 8))
    d2, l2 = d2.double(), l2.double()
    l2.load_state_dict(d2.state_dict(), strict=False)  # same alibi module in both
    torch.testing.assert_close(l2(x, x, x, is_causal=False)[0], d2(x, x, x)[0], atol=1e-6, rtol=0)


# ----------------------------------------------------------------------------------- top-k
def test_topk_with_k_equal_T_is_dense():
    q, k, v = qkv()
    out_d, w_d = BF.attention(q, k, v)
    s = topk_support(q, k, 37, chunk_size=10)
    w = s.posterior_weights()
    torch.testing.assert_close(SupportWeights(w, s.index, 37).to_dense(), w_d, atol=1e-6, rtol=0)
    torch.testing.assert_close(support_attend(w, s, v, chunk_size=7), out_d, atol=1e-6, rtol=0)
    assert float(s.dropped_mass.abs().max()) < 1e-12
    # the layer, with torch's layout and an unbatched input
    torch.manual_seed(1)
    x = torch.randn(25, 2, 16, dtype=torch.float64)
    d = BayesianMultiheadAttention(16, 4).double()
    t = BayesianMultiheadAttention(16, 4, kernel=TopKKernel(25)).double()
    t.load_state_dict(d.state_dict())
    torch.testing.assert_close(t(x, x, x)[0], d(x, x, x)[0], atol=1e-6, rtol=0)
    xu = x[:, 0]
    torch.testing.assert_close(t(xu, xu, xu)[1].to_dense(), d(xu, xu, xu)[1], atol=1e-6, rtol=0)


@pytest.mark.parametrize("causal", [False, True])
def test_topk_is_the_exact_posterior_restricted_to_the_k_best_keys(causal):
    q, k, v = qkv()
    dense, fn = masks(2, 3, 37, causal)
    s = topk_support(q, k, 6, fn, chunk_size=9)
    w_full = BF.posterior_weights(BF.attention_logits(q, k), dense)  # exact posterior
    # the kept keys are the 6 most probable ones (ties aside)
    ok = s.allowed().expand_as(s.logits).double()  # slots on allowed keys
    kept = SupportWeights(ok, s.index, 37).to_dense() > 0
    allowed = dense.expand_as(w_full) > float("-inf")
    n_keep = torch.minimum(allowed.sum(-1), torch.tensor(6))
    thr = w_full.sort(-1, descending=True).values.gather(-1, (n_keep - 1).clamp_min(0)[..., None])
    assert bool(((w_full >= thr - 1e-12) | ~kept).all())
    # weights = exact posterior restricted to them and renormalised (dense reference)
    restricted = dense + dense_support_mask(s)
    out_r, w_r = BF.attention(q, k, v, restricted)
    w = s.posterior_weights()
    torch.testing.assert_close(SupportWeights(w, s.index, 37).to_dense(), w_r, atol=1e-6, rtol=0)
    torch.testing.assert_close(support_attend(w, s, v), out_r, atol=1e-6, rtol=0)
    # dropped mass = exact posterior mass off the support, and it bounds the output error
    torch.testing.assert_close(s.dropped_mass, 1 - (w_full * kept).sum(-1), atol=1e-9, rtol=0)
    out_d = BF.attend(w_full, v)
    err = (out_r - out_d).norm(dim=-1)
    bound = 2 * s.dropped_mass * v.norm(dim=-1).amax(-1, keepdim=True)
    assert bool((err <= bound + 1e-9).all())
    assert float(s.dropped_mass.max()) > 0.01  # k=6 of 37 does drop mass here


def test_topk_layer_reports_dropped_mass():
    m = BayesianMultiheadAttention(16, 4, batch_first=True, kernel="topk")
    m.kernel.k = 3
    x = torch.randn(2, 12, 16)
    _, w = m(x, x, x)
    assert w.dropped_mass.shape == (2, 4, 12)
    assert torch.equal(m.kernel.last_dropped_mass, w.dropped_mass)


# -------------------------------------------------------------------------------- low rank
def test_lowrank_equals_dense_attention_over_projected_keys():
    q, k, v = qkv()
    E, Fv = torch.randn(5, 40, dtype=torch.float64), torch.randn(5, 40, dtype=torch.float64)
    kpm = torch.zeros(2, 37, dtype=torch.bool)
    kpm[1, :4] = True
    k_r, v_r = lowrank_project(k, v, E, Fv, kpm)
    keep = (~kpm).double()[:, None, :, None]
    torch.testing.assert_close(k_r, E[:, :37] @ (k * keep))
    out_d, w_d = BF.attention(q, k_r, Fv[:, :37] @ (v * keep))
    s = lowrank_support(q, k_r)
    torch.testing.assert_close(s.posterior_weights(), w_d)
    torch.testing.assert_close(support_attend(s.posterior_weights(), s, v_r), out_d)
    with pytest.raises(ValueError, match="max_len"):
        lowrank_project(torch.randn(1, 1, 50, 8), torch.randn(1, 1, 50, 8), E, Fv)


def test_lowrank_layer_mean_paths_agree_and_reject_masks():
    m = BayesianMultiheadAttention(16, 4, batch_first=True, kernel=LowRankKernel(6, 32))
    x = torch.randn(2, 20, 16)
    y1, w = m(x, x, x)
    y2, _ = m(x, x, x, need_weights=False)
    torch.testing.assert_close(y1, y2, atol=1e-5, rtol=0)
    assert w.weights.shape == (2, 4, 20, 6)
    with pytest.raises(ValueError, match="low-rank|mixtures"):
        w.to_dense()
    # torch's rule: with a mask the is_causal hint is dropped, so the mask is what is refused
    with pytest.raises(ValueError, match="attn_mask"):
        m(x, x, x, is_causal=True, attn_mask=torch.ones(20, 20).triu(1).bool())
    with pytest.raises(ValueError, match="LocalWindowPrior"):
        BayesianMultiheadAttention(16, 4, prior=LocalWindowPrior(2), kernel="lowrank")(x, x, x)


# ----------------------------------------------------------------- families on the support
def _dense_and_reduced(kind: str):
    q, k, _ = qkv(B=1, H=2, Tq=9, Tk=9, seed=3, dtype=torch.float32)
    kpm = torch.tensor([[False] * 7 + [True] * 2])
    kw = dict(batch_size=1, num_heads=2, tgt_len=9, src_len=9)
    dense = BF.mask_to_log_prior(None, kpm, **kw)
    fn = chunk_log_prior(None, kpm, **kw)
    s = local_support(q, k, 2, fn, chunk_size=4) if kind == "local" else topk_support(q, k, 4, fn)
    restricted = dense + dense_support_mask(s).float()  # (1, 2, 9, 9)
    return q, BF.attention_logits(q, k), restricted, s


def _scatter(latent_red: torch.Tensor, s, like: torch.Tensor) -> torch.Tensor:
    idx = s.index.expand(latent_red.shape).clamp(0, like.shape[-1] - 1)
    ok = s.allowed().expand(latent_red.shape)
    out = torch.zeros(latent_red.shape[:-1] + like.shape[-1:], dtype=like.dtype)
    return out.scatter_add(-1, idx, torch.where(ok, latent_red, 0.0))


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("kind", ["local", "topk"])
def test_family_on_support_is_the_dense_family_restricted_to_it(family, kind):
    torch.manual_seed(0)
    fam = get_family(family, num_heads=2, head_dim=8)
    q, logits, restricted, s = _dense_and_reduced(kind)
    allowed = s.allowed()
    for side in ("guide", "model"):
        if side == "guide":
            d_red = fam.guide(s.logits, s.log_prior.expand_as(s.logits), query=q)
            d_den = fam.guide(logits, restricted, query=q)
        else:
            d_red = fam.model(s.log_prior.expand_as(s.logits), s.logits)
            d_den = fam.model(restricted, logits)
        lat = d_red.rsample((50,))  # (50, 1, 2, 9, K)
        w = fam.to_weights(lat, allowed)
        torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:-1]), atol=1e-5, rtol=0)
        assert bool((w.masked_fill(allowed, 0.0) == 0).all())  # nothing on empty slots
        # same draws have the same density under the dense family restricted to the same keys
        lat_dense = _scatter(lat, s, logits)
        torch.testing.assert_close(
            d_red.log_prob(lat), d_den.log_prob(lat_dense), atol=2e-3, rtol=1e-4
        )
        w_dense = fam.to_weights(lat_dense, restricted.expand_as(logits) > float("-inf"))
        torch.testing.assert_close(_scatter(w, s, logits), w_dense, atol=1e-5, rtol=0)
    if fam.analytic_kl:
        p_red = fam.model(s.log_prior.expand_as(s.logits), s.logits)
        q_red = fam.guide(s.logits, s.log_prior.expand_as(s.logits), query=q)
        kl_red = fam.kl(q_red, p_red)
        kl_den = fam.kl(fam.guide(logits, restricted, query=q), fam.model(restricted, logits))
        torch.testing.assert_close(kl_red, kl_den, atol=1e-3, rtol=1e-4)


def test_dirichlet_mean_on_support_is_the_exact_restricted_posterior():
    torch.manual_seed(1)  # E[w] = p̄ exactly for the Dirichlet family: a distributional check
    fam = get_family("dirichlet", num_heads=2)
    _, _, _, s = _dense_and_reduced("topk")
    d = fam.guide(s.logits, s.log_prior.expand_as(s.logits))
    w = fam.to_weights(d.rsample((4000,)), s.allowed()).mean(0)
    torch.testing.assert_close(w, s.posterior_weights(), atol=0.02, rtol=0)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("kernel", ["local", "topk", "lowrank"])
def test_layer_samples_on_support_in_every_mode(family, kernel):
    torch.manual_seed(0)
    kern = get_kernel(kernel, **({"max_len": 32} if kernel == "lowrank" else {}))
    m = BayesianMultiheadAttention(16, 4, batch_first=True, family=family, kernel=kern)
    x = torch.randn(2, 20, 16)
    for mode in ("guide", "model"):
        with attention_mode(mode):
            tr = pyro.poutine.trace(lambda: m(x, x, x, num_samples=3)).get_trace()
        y, w = tr.nodes["_RETURN"]["value"]
        assert y.shape == (3, 2, 20, 16)
        K = w.weights.shape[-1]
        assert tr.nodes["latent"]["value"].shape[-3:] == (4, 20, K)
        torch.testing.assert_close(w.weights.sum(-1), torch.ones(3, 2, 4, 20), atol=1e-5, rtol=0)
    with collect_kl() as col:
        y, _ = m(x, x, x, num_samples=2)
    (y.sum() + col.total().sum()).backward()
    assert all(p.grad is not None for p in m.family.parameters())


def test_network_trains_with_kernel_config():
    pyro.clear_param_store()
    torch.manual_seed(0)
    for kernel, kw in (
        ("local", {"window": 2}),
        ("topk", {"k": 4}),
        ("lowrank", {"rank": 4, "max_len": 13}),
    ):
        cfg = AttentionConfig(family="dirichlet", kernel=kernel, kernel_kwargs=kw)
        net = TransformerClassifier(
            3, vocab_size=10, d_model=16, nhead=2, max_len=12, attention=cfg
        )
        assert all(isinstance(m.self_attn.kernel, nn.Module) for m in net.encoder.layers)
        x = torch.randint(1, 10, (4, 12))
        y = torch.randint(0, 3, (4,))
        loss, logits = net.elbo_loss(x, y, num_data=4)
        loss.backward()
        assert torch.isfinite(loss) and logits.shape == (4, 3)
        elbo = pyro.infer.Trace_ELBO().differentiable_loss(net.model, net.guide, x, y)
        assert torch.isfinite(elbo)


def test_state_dict_of_torch_mha_loads_and_bad_options_raise():
    t = nn.MultiheadAttention(16, 4, batch_first=True)
    m = BayesianMultiheadAttention(16, 4, batch_first=True, kernel=LowRankKernel(4, 16))
    m.load_state_dict(t.state_dict())
    with pytest.raises(ValueError, match="window"):
        LocalKernel(-1)
    with pytest.raises(ValueError, match="kernel must be one of"):
        get_kernel("flash")
    with pytest.raises(ValueError, match="kernel must be one of"):
        AttentionConfig(kernel="nope")
    with pytest.raises(TypeError, match="kernel"):
        BayesianMultiheadAttention(16, 4, kernel=3)
    x = torch.randn(2, 5, 16)
    b = BayesianMultiheadAttention(16, 4, batch_first=True, add_bias_kv=True, kernel="local")
    with pytest.raises(ValueError, match="add_bias_kv"):
        b(x, x, x)
