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
from bayesattn.functional.supports import (
    SupportWeights,
    chunk_log_prior,
    cluster_topk_support,
    dense_support_mask,
    local_attention,
    local_global_support,
    local_support,
    lowrank_project,
    lowrank_support,
    support_attend,
    tiled_attention,
    tiled_posterior_read,
    topk_support,
)
from bayesattn.nn.blocks import AttentionConfig
from bayesattn.nn.networks import TransformerClassifier
from bayesattn.nn.supports import (
    ClusterTopKSupport,
    LocalGlobalSupport,
    LocalSupport,
    LowRankSupport,
    TiledSupport,
    TopKSupport,
    get_support,
)
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
    loc = BayesianMultiheadAttention(16, 4, batch_first=True, support=LocalSupport(3, 8)).double()
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
    l2 = BayesianMultiheadAttention(16, 4, batch_first=True, prior=alibi, support=LocalSupport(3, 8))
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
    t = BayesianMultiheadAttention(16, 4, support=TopKSupport(25)).double()
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
    m = BayesianMultiheadAttention(16, 4, batch_first=True, support="topk")
    m.support.k = 3
    x = torch.randn(2, 12, 16)
    _, w = m(x, x, x)
    assert w.dropped_mass.shape == (2, 4, 12)
    assert torch.equal(m.support.last_dropped_mass, w.dropped_mass)


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
    m = BayesianMultiheadAttention(16, 4, batch_first=True, support=LowRankSupport(6, 32))
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
        BayesianMultiheadAttention(16, 4, prior=LocalWindowPrior(2), support="lowrank")(x, x, x)


# ----------------------------------------------------------------- families on the support
def _dense_and_reduced(kind: str):
    q, k, _ = qkv(B=1, H=2, Tq=9, Tk=9, seed=3, dtype=torch.float32)
    kpm = torch.tensor([[False] * 7 + [True] * 2])
    kw = dict(batch_size=1, num_heads=2, tgt_len=9, src_len=9)
    dense = BF.mask_to_log_prior(None, kpm, **kw)
    fn = chunk_log_prior(None, kpm, **kw)
    if kind == "local":
        s = local_support(q, k, 2, fn, chunk_size=4)
    elif kind == "local_global":
        s = local_global_support(q, k, 1, torch.tensor([0, 6]), fn, chunk_size=4)
    else:
        s = topk_support(q, k, 4, fn)
    restricted = dense + dense_support_mask(s).float()  # (1, 2, 9, 9)
    if s.global_rows is not None:  # the main support leaves the global rows empty (read densely)
        restricted = restricted.index_fill(-2, s.global_rows, float("-inf"))
    return q, BF.attention_logits(q, k), restricted, s


def _scatter(latent_red: torch.Tensor, s, like: torch.Tensor) -> torch.Tensor:
    idx = s.index.expand(latent_red.shape).clamp(0, like.shape[-1] - 1)
    ok = s.allowed().expand(latent_red.shape)
    out = torch.zeros(latent_red.shape[:-1] + like.shape[-1:], dtype=like.dtype)
    return out.scatter_add(-1, idx, torch.where(ok, latent_red, 0.0))


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("kind", ["local", "local_global", "topk"])
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
        live = allowed.any(-1).float().expand(w.shape[:-1])  # local_global: global rows empty
        torch.testing.assert_close(w.sum(-1), live, atol=1e-5, rtol=0)
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
@pytest.mark.parametrize("kernel", ["local", "local_global", "topk", "cluster_topk", "lowrank"])
def test_layer_samples_on_support_in_every_mode(family, kernel):
    torch.manual_seed(0)
    kern = get_support(kernel, **({"max_len": 32} if kernel == "lowrank" else {}))
    m = BayesianMultiheadAttention(16, 4, batch_first=True, family=family, support=kern)
    x = torch.randn(2, 20, 16)
    for mode in ("guide", "model"):
        with attention_mode(mode):
            tr = pyro.poutine.trace(lambda: m(x, x, x, num_samples=3)).get_trace()
        y, w = tr.nodes["_RETURN"]["value"]
        assert y.shape == (3, 2, 20, 16)
        K = w.weights.shape[-1]
        assert tr.nodes["latent"]["value"].shape[-3:] == (4, 20, K)
        rows = w.weights if w.index is None else w.to_dense()  # with the global rows
        torch.testing.assert_close(rows.sum(-1), torch.ones(rows.shape[:-1]), atol=1e-5, rtol=0)
        if kernel == "local_global":  # the CLS row is its own site, over every key
            assert tr.nodes["global/latent"]["value"].shape[-3:] == (4, 1, 20)
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
        cfg = AttentionConfig(family="dirichlet", support=kernel, support_kwargs=kw)
        net = TransformerClassifier(
            3, vocab_size=10, d_model=16, nhead=2, max_len=12, attention=cfg
        )
        assert all(isinstance(m.self_attn.support, nn.Module) for m in net.encoder.layers)
        x = torch.randint(1, 10, (4, 12))
        y = torch.randint(0, 3, (4,))
        loss, logits = net.elbo_loss(x, y, num_data=4)
        loss.backward()
        assert torch.isfinite(loss) and logits.shape == (4, 3)
        elbo = pyro.infer.Trace_ELBO().differentiable_loss(net.model, net.guide, x, y)
        assert torch.isfinite(elbo)


def test_state_dict_of_torch_mha_loads_and_bad_options_raise():
    t = nn.MultiheadAttention(16, 4, batch_first=True)
    m = BayesianMultiheadAttention(16, 4, batch_first=True, support=LowRankSupport(4, 16))
    m.load_state_dict(t.state_dict())
    with pytest.raises(ValueError, match="window"):
        LocalSupport(-1)
    with pytest.raises(ValueError, match="support must be one of"):
        get_support("flash")
    with pytest.raises(ValueError, match="support must be one of"):
        AttentionConfig(support="nope")
    with pytest.raises(TypeError, match="support"):
        BayesianMultiheadAttention(16, 4, support=3)
    x = torch.randn(2, 5, 16)
    b = BayesianMultiheadAttention(16, 4, batch_first=True, add_bias_kv=True, support="local")
    with pytest.raises(ValueError, match="add_bias_kv"):
        b(x, x, x)


# ------------------------------------------------------------------------- local + global
def _local_global_mask(T, window, glob):
    """Independent reference: 0 where query i may read key j (band, global key, global query)."""
    i, j = torch.arange(T).unsqueeze(-1), torch.arange(T)
    g = torch.zeros(T, dtype=torch.bool)
    g[list(glob)] = True
    ok = ((i - j).abs() <= window) | g[j] | g.unsqueeze(-1)
    return torch.zeros(T, T, dtype=torch.float64).masked_fill(~ok, float("-inf"))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("chunk", [6, None])
def test_local_global_equals_dense_attention_on_the_same_support(causal, chunk):
    q, k, v = qkv()
    glob = [0, 5, 20]
    dense, fn = masks(2, 3, 37, causal)
    lp = dense + _local_global_mask(37, 3, glob)
    out_d, w_d = BF.attention(q, k, v, lp)
    s = local_global_support(q, k, 3, torch.tensor(glob), fn, chunk_size=chunk)
    assert s.logits.shape == (2, 3, 37, 7 + 3) and s.global_support.logits.shape == (2, 3, 3, 37)
    torch.testing.assert_close(dense + dense_support_mask(s), lp.expand_as(w_d))
    w, gw = s.posterior_weights(), s.global_support.posterior_weights()
    sw = SupportWeights(w, s.index, 37, global_rows=s.global_rows, global_weights=gw)
    torch.testing.assert_close(sw.to_dense(), w_d, atol=1e-6, rtol=0)
    torch.testing.assert_close(support_attend(w, s, v, chunk_size=chunk), out_d, atol=1e-6, rtol=0)
    out_f = local_attention(q, k, v, 3, fn, chunk_size=chunk, global_keys=torch.tensor(glob))
    torch.testing.assert_close(out_f, out_d, atol=1e-6, rtol=0)
    # each key appears once in a support: a global key inside the band is not repeated
    ok = s.allowed().expand(s.logits.shape)
    idx = s.index.expand(ok.shape).masked_fill(~ok, -1)
    srt = idx.sort(-1).values
    assert bool(((srt[..., 1:] != srt[..., :-1]) | (srt[..., 1:] < 0)).all())


def test_local_global_layer_equals_dense_layer_with_the_support_mask():
    torch.manual_seed(0)
    x = torch.randn(2, 30, 16, dtype=torch.float64)
    mask = _local_global_mask(30, 2, [0, 17])
    dense = BayesianMultiheadAttention(16, 4, batch_first=True).double()
    lg = BayesianMultiheadAttention(
        16, 4, batch_first=True, support=LocalGlobalSupport(2, (0, 17), chunk_size=8)
    ).double()
    lg.load_state_dict(dense.state_dict())
    y_d, w_d = dense(x, x, x, attn_mask=mask, average_attn_weights=False)
    y_l, w_l = lg(x, x, x, average_attn_weights=False)
    torch.testing.assert_close(y_l, y_d, atol=1e-6, rtol=0)
    torch.testing.assert_close(w_l.to_dense(), w_d, atol=1e-6, rtol=0)
    torch.testing.assert_close(lg(x, x, x, need_weights=False)[0], y_d, atol=1e-6, rtol=0)
    # CLS read-out: one query row (position 0, global) reads every key, as dense does
    torch.testing.assert_close(lg(x[:, :1], x, x)[0], dense(x[:, :1], x, x)[0], atol=1e-6, rtol=0)
    kpm = torch.zeros(2, 30, dtype=torch.bool)
    kpm[1, 20:] = True
    torch.testing.assert_close(
        lg(x, x, x, key_padding_mask=kpm)[0],
        dense(x, x, x, key_padding_mask=kpm, attn_mask=mask)[0],
        atol=1e-6,
        rtol=0,
    )
    # a key-relevance prior applies on the support (band, global keys and global rows)
    alibi = DistanceDecayPrior(4)
    d2 = BayesianMultiheadAttention(16, 4, batch_first=True, prior=alibi).double()
    l2 = BayesianMultiheadAttention(
        16, 4, batch_first=True, prior=alibi, support=LocalGlobalSupport(2, (0, 17), chunk_size=8)
    ).double()
    l2.load_state_dict(d2.state_dict(), strict=False)
    torch.testing.assert_close(l2(x, x, x)[0], d2(x, x, x, attn_mask=mask)[0], atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="global_tokens"):
        LocalGlobalSupport(2, (-1,))
    with pytest.raises(ValueError, match="global_keys"):
        local_global_support(x[None], x[None], 2, torch.tensor([0.5]))


# ------------------------------------------------------------------ top-k through clusters
def _clustered(T=256, D=8, C=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    centres = 3 * torch.randn(C, D, generator=g, dtype=torch.float64)
    k = centres[torch.randint(0, C, (2, 2, T), generator=g)] + 0.3 * torch.randn(
        2, 2, T, D, generator=g, dtype=torch.float64
    )
    q = centres[torch.randint(0, C, (2, 2, T), generator=g)] + 0.3 * torch.randn(
        2, 2, T, D, generator=g, dtype=torch.float64
    )
    v = torch.randn(2, 2, T, D, generator=g, dtype=torch.float64)
    return q, k, v


def test_cluster_topk_probing_every_cluster_is_exact_topk():
    q, k, v = qkv()
    exact = topk_support(q, k, 6)
    s = cluster_topk_support(q, k, 6, num_clusters=5, probes=100)  # every bucket
    assert torch.equal(s.index.sort(-1).values, exact.index.sort(-1).values)
    torch.testing.assert_close(s.dropped_mass, exact.dropped_mass, atol=1e-9, rtol=0)
    torch.testing.assert_close(
        support_attend(s.posterior_weights(), s, v),
        support_attend(exact.posterior_weights(), exact, v),
        atol=1e-9,
        rtol=0,
    )


@pytest.mark.parametrize("causal", [False, True])
def test_cluster_topk_recall_and_its_bound_holds(causal):
    q, k, v = _clustered()
    T = 256
    kpm = torch.zeros(2, 1, T, dtype=torch.bool)
    kpm[1, 0, -30:] = True
    s = cluster_topk_support(q, k, 8, key_padding_mask=kpm, is_causal=causal, probes=4)
    lp = torch.zeros(2, 1, 1, T, dtype=torch.float64).masked_fill(kpm[:, :, None], float("-inf"))
    if causal:
        lp = lp + BF.causal_log_prior(T, T).double()
    exact = topk_support(q, k, 8, lambda a, b, idx: lp[..., a:b, :].expand(2, 1, b - a, T))
    ok = s.allowed().expand(s.logits.shape)
    ex_ok = exact.allowed().expand(exact.logits.shape)
    mine = SupportWeights(ok.double(), s.index, T).to_dense() > 0
    best = SupportWeights(ex_ok.double(), exact.index, T).to_dense() > 0
    recall = (mine & best).sum() / best.sum()
    # clustered keys: candidates hold nearly every true top-8 key (causal: 0.918 measured)
    assert float(recall) > (0.9 if causal else 0.95)
    assert s.index.shape[-1] == 8 and float(s.index.max()) < T
    # the reported bound is >= the mass actually dropped (dense posterior), for every query
    w_full = BF.posterior_weights(BF.attention_logits(q, k), lp)
    dropped = 1 - (w_full * mine).sum(-1)
    assert bool((s.dropped_mass >= dropped - 1e-9).all())
    assert float(s.dropped_mass.min()) >= 0 and float(s.dropped_mass.max()) <= 1
    # ... and so bounds the read's error against exact dense attention
    err = (support_attend(s.posterior_weights(), s, v) - BF.attend(w_full, v)).norm(dim=-1)
    assert bool((err <= 2 * s.dropped_mass * v.norm(dim=-1).amax(-1, keepdim=True) + 1e-9).all())


def test_cluster_topk_layer_masks_and_refusals():
    torch.manual_seed(0)
    m = BayesianMultiheadAttention(16, 4, batch_first=True, support=ClusterTopKSupport(4, 3, 100))
    d = BayesianMultiheadAttention(16, 4, batch_first=True, support=TopKSupport(4))
    d.load_state_dict(m.state_dict())
    x = torch.randn(2, 24, 16)
    kpm = torch.zeros(2, 24, dtype=torch.bool)
    kpm[0, 10:] = True
    # every cluster probed: the layer equals exact top-k (padding included)
    y, w = m(x, x, x, key_padding_mask=kpm)
    y_d, w_d = d(x, x, x, key_padding_mask=kpm)
    torch.testing.assert_close(y, y_d, atol=1e-5, rtol=0)
    torch.testing.assert_close(w.dropped_mass, w_d.dropped_mass, atol=1e-5, rtol=0)
    causal = torch.ones(24, 24, dtype=torch.bool).triu(1)  # torch: the hint stands for the mask
    kw = dict(attn_mask=causal, is_causal=True, need_weights=False)
    torch.testing.assert_close(m(x, x, x, **kw)[0], d(x, x, x, **kw)[0], atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="attn_mask"):
        m(x, x, x, attn_mask=torch.zeros(24, 24))
    p = BayesianMultiheadAttention(16, 4, prior=DistanceDecayPrior(4), support="cluster_topk")
    with pytest.raises(ValueError, match="DistanceDecayPrior"):
        p(x[0], x[0], x[0])
    with pytest.raises(ValueError, match="key_padding_mask"):
        cluster_topk_support(x[None], x[None], 2, key_padding_mask=torch.zeros(1, 24))


# ------------------------------------------------------------- tiled exact attention, O(T)
def test_tiled_attention_and_tiled_reads_equal_dense():
    q, k, v = qkv()
    dense, fn = masks(2, 3, 37, True)
    out_d, w_d = BF.attention(q, k, v, dense)
    torch.testing.assert_close(tiled_attention(q, k, v, fn, tile=5), out_d, atol=1e-9, rtol=0)
    torch.testing.assert_close(tiled_attention(q, k, v, tile=8), BF.attention(q, k, v)[0])

    def mean_draws(lg, lp, qt):  # S = 2 copies of the exact posterior of the tile
        return BF.posterior_weights(lg, lp).expand((2,) + lg.shape)

    out = tiled_posterior_read(q, k, v, mean_draws, fn, tile=6)
    torch.testing.assert_close(out, out_d.expand((2,) + out_d.shape), atol=1e-9, rtol=0)


@pytest.mark.parametrize("family", ["dirichlet", "logistic_normal"])
def test_tiled_layer_draws_are_the_dense_family_per_tile(family):
    """Tile sites concatenated = one draw of the dense layer's family: same density, and the
    read equals the dense read of those weights."""
    torch.manual_seed(0)
    x = torch.randn(2, 21, 16, dtype=torch.float64)
    m = BayesianMultiheadAttention(
        16, 4, batch_first=True, family=family, support=TiledSupport(tile=8)
    ).double()
    with attention_mode("guide"):
        tr = pyro.poutine.trace(lambda: m(x, x, x, need_weights=False, num_samples=3)).get_trace()
        y = tr.nodes["_RETURN"]["value"][0]
        names = [n for n, s in tr.nodes.items() if s["type"] == "sample"]
        assert names == ["tile0/latent", "tile8/latent", "tile16/latent"]
        lat = torch.cat([tr.nodes[n]["value"] for n in names], dim=-2)  # (3, 2, 4, 21, 21)
        tr.compute_log_prob()
        lp_tiles = sum(tr.nodes[n]["log_prob"] for n in names)
        # the same latent through the dense layer's own site
        dense = BayesianMultiheadAttention(16, 4, batch_first=True, family=family).double()
        dense.load_state_dict(m.state_dict())
        cond = pyro.poutine.condition(data={"latent": lat})
        t2 = pyro.poutine.trace(cond(lambda: dense(x, x, x, num_samples=3))).get_trace()
    t2.compute_log_prob()
    torch.testing.assert_close(t2.nodes["latent"]["log_prob"], lp_tiles, atol=1e-6, rtol=1e-9)
    torch.testing.assert_close(t2.nodes["_RETURN"]["value"][0], y, atol=1e-9, rtol=0)
    with collect_kl() as col:
        m(x, x, x, need_weights=False, num_samples=2)
    assert col.total().shape == (2, 2)


# ------------------------------------------------------------------ empty and dead inputs
@pytest.mark.parametrize(
    "kernel", ["local", "local_global", "topk", "cluster_topk", "tiled", "lowrank"]
)
def test_zero_length_and_fully_padded_inputs_behave_like_dense(kernel):
    torch.manual_seed(0)
    dense = BayesianMultiheadAttention(16, 4, batch_first=True)
    m = BayesianMultiheadAttention(16, 4, batch_first=True, support=kernel)
    m.load_state_dict(dense.state_dict(), strict=False)
    for tq, tk in ((0, 0), (0, 5), (3, 0)):
        q, kv = torch.randn(2, tq, 16), torch.randn(2, tk, 16)
        y, w = m(q, kv, kv)
        assert y.shape == (2, tq, 16)
        torch.testing.assert_close(y, dense(q, kv, kv)[0])  # no key: zeros (+ output bias)
        assert w.weights.shape[:3] == (2, 4, tq)
    x = torch.randn(2, 6, 16)
    kpm = torch.zeros(2, 6, dtype=torch.bool)
    kpm[1] = True  # every key of the second sequence padded
    with torch.no_grad():
        y, w = m(x, x, x, key_padding_mask=kpm)
        y_d = dense(x, x, x, key_padding_mask=kpm)[0]
    torch.testing.assert_close(y[1], y_d[1], atol=1e-5, rtol=0)  # no key: out_proj's bias
    assert float(w.weights[1].abs().max()) == 0.0  # no weight anywhere, as in dense attention
    rows = w.weights[0] if w.index is None else w.to_dense()[0]
    torch.testing.assert_close(rows.sum(-1), torch.ones(rows.shape[:-1]))


# ---- issue 33: round 4 ------------------------------------------------------------------------
def test_local_global_global_tokens_are_checked_against_the_sequence():
    with pytest.raises(TypeError, match="global_tokens must be a collection"):
        LocalGlobalSupport(global_tokens=None)
    # a set of positions: order and repeats do not matter (round 5)
    assert LocalGlobalSupport(global_tokens=(3, 1, 3)).global_tokens == (1, 3)
    assert LocalGlobalSupport(global_tokens={4, 0}).global_tokens == (0, 4)
    m = BayesianMultiheadAttention(8, 2, batch_first=True,
                                   support=LocalGlobalSupport(window=2, global_tokens=(50,)))
    x = torch.randn(1, 10, 8)
    for mode, need in (("mean", False), ("mean", True), ("guide", True)):
        with attention_mode(mode), pytest.raises(ValueError, match=r"global_tokens .*T = 10"):
            m(x, x, x, need_weights=need)


@pytest.mark.parametrize("family", [None, "dirichlet"])
def test_local_global_with_window_at_least_t_equals_dense(family):
    torch.manual_seed(0)
    dense = BayesianMultiheadAttention(8, 2, batch_first=True, family=family)
    m = BayesianMultiheadAttention(8, 2, batch_first=True, family=family,
                                   support=LocalGlobalSupport(window=9, global_tokens=(0, 3)))
    m.load_state_dict(dense.state_dict(), strict=False)
    x = torch.randn(2, 6, 8)
    with attention_mode("mean"), torch.no_grad():
        torch.testing.assert_close(m(x, x, x)[0], dense(x, x, x)[0], atol=1e-5, rtol=0)


def test_cluster_topk_takes_causal_masking_with_padding():
    """The docs say it takes is_causal and a key_padding_mask: together they were refused. With
    k >= T and one cluster it is dense attention under both masks."""
    torch.manual_seed(0)
    dense = BayesianMultiheadAttention(8, 2, batch_first=True)
    m = BayesianMultiheadAttention(8, 2, batch_first=True,
                                   support=ClusterTopKSupport(k=12, num_clusters=1, probes=1))
    m.load_state_dict(dense.state_dict(), strict=False)
    x = torch.randn(2, 12, 8)
    kpm = torch.zeros(2, 12, dtype=torch.bool)
    kpm[1, 9:] = True
    causal = nn.Transformer.generate_square_subsequent_mask(12)
    with attention_mode("mean"), torch.no_grad():
        y, _ = m(x, x, x, key_padding_mask=kpm, attn_mask=causal, is_causal=True)
        want, _ = dense(x, x, x, key_padding_mask=kpm, attn_mask=causal)
    torch.testing.assert_close(y, want, atol=1e-5, rtol=0)


def test_lowrank_takes_a_float_padding_mask_like_the_others():
    torch.manual_seed(0)
    m = BayesianMultiheadAttention(8, 2, batch_first=True, support=LowRankSupport(rank=4, max_len=12))
    x = torch.randn(2, 12, 8)
    kpm = torch.zeros(2, 12, dtype=torch.bool)
    kpm[1, 9:] = True
    as_float = torch.zeros(2, 12).masked_fill(kpm, float("-inf"))
    with attention_mode("mean"), torch.no_grad():
        torch.testing.assert_close(m(x, x, x, key_padding_mask=as_float)[0],
                                   m(x, x, x, key_padding_mask=kpm)[0])  # fmt: skip
        with pytest.raises(ValueError, match="0 \\(keep\\) and -inf \\(padded\\) only"):
            m(x, x, x, key_padding_mask=torch.full((2, 12), -0.5))


# ---- round 5 ------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", [None, "dirichlet"])
def test_cluster_topk_on_an_empty_batch_reads_nothing(family):
    m = BayesianMultiheadAttention(8, 2, batch_first=True, family=family,
                                   support=ClusterTopKSupport(k=3, num_clusters=2))  # fmt: skip
    x = torch.randn(0, 6, 8)
    y, _ = m(x, x, x)
    assert y.shape == (0, 6, 8)


@pytest.mark.parametrize("support", [ClusterTopKSupport(k=3, num_clusters=2),
                                     LowRankSupport(rank=3, max_len=8)])  # fmt: skip
def test_supports_that_skip_keys_refuse_soft_and_integer_padding_masks(support):
    """A float mask of 1.0 (a user's "padded") is a +1 bias to dense attention; a support that
    does not score every key cannot apply it and said nothing (cluster top-k ignored it, and
    ignored an int mask too). 0/-inf float masks equal the bool mask."""
    m = BayesianMultiheadAttention(8, 2, batch_first=True, support=support)
    x = torch.randn(2, 6, 8)
    pad = torch.zeros(2, 6, dtype=torch.bool)
    pad[1, 4:] = True
    with pytest.raises(ValueError, match="takes a float key_padding_mask of 0 .* and -inf"):
        m(x, x, x, key_padding_mask=pad.float())
    with pytest.raises(TypeError, match="key_padding_mask must be bool or float"):
        m(x, x, x, key_padding_mask=pad.long())
    hard = torch.zeros(2, 6).masked_fill(pad, float("-inf"))
    with torch.no_grad(), attention_mode("mean"):
        torch.testing.assert_close(m(x, x, x, key_padding_mask=hard)[0],
                                   m(x, x, x, key_padding_mask=pad)[0], rtol=0, atol=0)  # fmt: skip


def test_local_global_compiles_with_fullgraph_and_matches_eager():
    """The docs say ``torch.compile(fullgraph=True)`` works in mean mode: local + global hit
    data-dependent branches on the global token positions (now static Python ints)."""
    torch.manual_seed(0)
    m = BayesianMultiheadAttention(8, 2, batch_first=True,
                                   support=LocalGlobalSupport(window=2, global_tokens=(3, 0, 3)))
    m.eval()
    x = torch.randn(2, 10, 8)
    kpm = torch.zeros(2, 10).masked_fill(torch.arange(10) >= 7, float("-inf"))
    compiled = torch.compile(m, fullgraph=True, backend="eager")
    with torch.no_grad():
        for kw in ({}, {"key_padding_mask": kpm, "need_weights": False}):
            torch.testing.assert_close(compiled(x, x, x, **kw)[0], m(x, x, x, **kw)[0],
                                       atol=1e-6, rtol=0)  # fmt: skip
