import pyro
import pytest
import torch
from pyro import poutine
from pyro.infer import Predictive
from pyro.nn import PyroModule
from torch.distributions.relaxed_categorical import ExpRelaxedCategorical

import bayesattn.nn.supports.dense as attn_mod
from bayesattn.nn.attention import BayesianMultiheadAttention as BMHA
from bayesattn.nn.modes import attention_mode, collect_kl
from bayesattn.priors import CausalPrior, ContextualPrior, DistanceDecayPrior

E, H = 16, 4
FAMILIES = ["dirichlet", "logistic_normal", "weibull", "concrete"]


def _pair(batch_first, family=None, **kw):
    ref = torch.nn.MultiheadAttention(E, H, batch_first=batch_first, **kw).eval()
    ours = BMHA(E, H, batch_first=batch_first, family=family, **kw).eval()
    ours.load_state_dict(ref.state_dict())
    return ref, ours


def _inputs(batch_first, B=3, T=5, S=7, kdim=E, vdim=E):
    def mk(t, e):
        return torch.randn(B, t, e) if batch_first else torch.randn(t, B, e)

    return mk(T, E), mk(S, kdim), mk(S, vdim)


def _masks(B=3, T=5, S=7):
    kpm = torch.zeros(B, S, dtype=torch.bool)
    kpm[0, -2:] = True
    amb = torch.rand(T, S) < 0.3
    amb[:, 0] = False  # keep at least one key per row: torch gives NaN on empty rows
    return {
        "none": {},
        "key_padding": dict(key_padding_mask=kpm),
        "float_kpm": dict(key_padding_mask=torch.randn(B, S)),
        "float_attn": dict(attn_mask=torch.randn(T, S)),
        "bool_attn+kpm": dict(attn_mask=amb, key_padding_mask=kpm),
        "3d_attn": dict(attn_mask=torch.randn(B * H, T, S)),
    }


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize(
    "kw",
    [{}, dict(add_bias_kv=True), dict(add_zero_attn=True), dict(kdim=6, vdim=5), dict(bias=False)],
    ids=["default", "bias_kv", "zero_attn", "kvdim", "nobias"],
)
@pytest.mark.parametrize("mask", list(_masks()))
def test_reproduces_torch_multihead_attention(batch_first, kw, mask):
    ref, ours = _pair(batch_first, **kw)
    q, k, v = _inputs(batch_first, kdim=kw.get("kdim", E), vdim=kw.get("vdim", E))
    masks = _masks()[mask]
    with torch.no_grad():
        for avg in (True, False):
            r = ref(q, k, v, average_attn_weights=avg, **masks)
            o = ours(q, k, v, average_attn_weights=avg, **masks)
            torch.testing.assert_close(o[0], r[0], atol=1e-5, rtol=0)
            torch.testing.assert_close(o[1], r[1], atol=1e-5, rtol=0)
        r = ref(q, k, v, need_weights=False, **masks)
        o = ours(q, k, v, need_weights=False, **masks)
        assert r[1] is None and o[1] is None
        torch.testing.assert_close(o[0], r[0], atol=1e-5, rtol=0)


def test_same_state_dict_keys_and_defaults():
    for kw in [{}, dict(kdim=6, vdim=5, add_bias_kv=True)]:
        ref, ours = torch.nn.MultiheadAttention(E, H, **kw), BMHA(E, H, **kw)
        assert set(ref.state_dict()) == set(ours.state_dict())
        assert ours.batch_first is False and ours.dropout == 0.0


def test_causal_self_attention_and_unbatched():
    ref, ours = _pair(True)
    x = torch.randn(2, 6, E)
    cm = torch.nn.Transformer.generate_square_subsequent_mask(6)
    with torch.no_grad():
        r = ref(x, x, x, attn_mask=cm, is_causal=True)
        torch.testing.assert_close(ours(x, x, x, attn_mask=cm, is_causal=True)[0], r[0])
        # torch's rule: is_causal is a hint that needs the mask (torch's eval fast path skips
        # the check and silently ignores the hint; we always raise)
        with pytest.raises(RuntimeError, match="Need attn_mask"):
            ours(x, x, x, is_causal=True)
    with pytest.raises(RuntimeError, match="Need attn_mask"):
        ref.train()(x, x, x, is_causal=True)
    ref.eval()
    with torch.no_grad():
        u = torch.randn(6, E)
        for avg in (True, False):
            r, o = ref(u, u, u, average_attn_weights=avg), ours(u, u, u, average_attn_weights=avg)
            assert o[1].shape == r[1].shape
            torch.testing.assert_close(o[0], r[0], atol=1e-5, rtol=0)
            torch.testing.assert_close(o[1], r[1], atol=1e-5, rtol=0)


def test_mean_mode_of_stochastic_layer_is_torch():
    ref, ours = _pair(True, family="dirichlet")
    q, k, v = _inputs(True)
    with torch.no_grad(), attention_mode("mean"):
        torch.testing.assert_close(ours(q, k, v)[0], ref(q, k, v)[0], atol=1e-5, rtol=0)


def test_fused_path_when_weights_not_needed(monkeypatch):
    calls = []
    real = attn_mod.F.scaled_dot_product_attention

    def spy(*a, **k):
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(attn_mod.F, "scaled_dot_product_attention", spy)
    ref, m = _pair(True)
    x = torch.randn(2, 5, E)
    with torch.no_grad():
        fused, none = m(x, x, x, need_weights=False)
        assert len(calls) == 1 and none is None
        explicit, w = m(x, x, x, need_weights=True)
        assert len(calls) == 1
        # both paths give torch's values
        torch.testing.assert_close(fused, explicit, atol=1e-6, rtol=0)
        r, rw = ref(x, x, x)
        torch.testing.assert_close(fused, r, atol=1e-5, rtol=0)
        torch.testing.assert_close(w, rw, atol=1e-6, rtol=0)


@pytest.mark.parametrize("need_weights", [True, False])
def test_all_masked_rows_are_zero_not_nan(need_weights):
    m = BMHA(E, H, batch_first=True)
    x = torch.randn(2, 5, E, requires_grad=True)
    kpm = torch.zeros(2, 5, dtype=torch.bool)
    kpm[1] = True  # every key of example 1 is padding
    y, w = m(x, x, x, key_padding_mask=kpm, need_weights=need_weights)
    assert torch.isfinite(y).all()
    torch.testing.assert_close(y[1], m.out_proj.bias.expand(5, E))  # zero read, then out_proj
    y.sum().backward()
    assert torch.isfinite(x.grad).all()
    if need_weights:
        assert torch.all(w[1] == 0)


@pytest.mark.parametrize("family", FAMILIES)
def test_stochastic_layer_samples_and_vectorises(family):
    m = BMHA(E, H, batch_first=True, family=family, prior=CausalPrior())
    x = torch.randn(2, 5, E)
    y, w = m(x, x, x, num_samples=6, average_attn_weights=False)
    assert y.shape == (6, 2, 5, E) and w.shape == (6, 2, H, 5, 5)
    torch.testing.assert_close(w.sum(-1), torch.ones(6, 2, H, 5))
    assert torch.all(w.triu(1) == 0)  # causal prior: no mass on future keys
    assert w.std(0).mean() > 0  # different draws
    y.square().mean().backward()
    grads = [p.grad for p in m.parameters() if p.requires_grad and p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("family", FAMILIES)
def test_vectorised_samples_match_separate_calls_in_distribution(family):
    """S draws in one pass have the same distribution as S separate calls (same seed stream)."""
    m = BMHA(E, H, batch_first=True, family=family)
    x = torch.randn(1, 4, E)
    with torch.no_grad():
        one = m(x, x, x, num_samples=4000)[1]
        sep = torch.stack([m(x, x, x)[1] for _ in range(400)])
    torch.testing.assert_close(one.mean(0), sep.mean(0), atol=0.02, rtol=0)


def test_sites_model_guide_and_predictive():
    m = BMHA(E, H, batch_first=True, family="dirichlet")
    x = torch.randn(3, 5, E)

    def model():
        with attention_mode("model"), pyro.plate("data", 3):
            y, _ = m(x, x, x)
            pyro.sample("obs", pyro.distributions.Normal(y.sum((-1, -2)), 1.0), obs=torch.zeros(3))

    def guide():
        with attention_mode("guide"), pyro.plate("data", 3):
            m(x, x, x)

    tr = poutine.trace(guide).get_trace()
    assert tr.nodes["latent"]["value"].shape == (3, H, 5, 5)
    mt = poutine.trace(poutine.replay(model, trace=tr)).get_trace()
    assert torch.equal(mt.nodes["latent"]["value"], tr.nodes["latent"]["value"])
    assert "weights" in mt.nodes
    pred = Predictive(model, guide=guide, num_samples=7)()
    assert pred["latent"].shape[-4:] == (3, H, 5, 5) and pred["latent"].shape[0] == 7
    assert pred["weights"].shape[0] == 7 and pred["obs"].shape == (7, 3)
    # the ELBO is finite and differentiable
    loss = pyro.infer.Trace_ELBO().differentiable_loss(model, guide)
    loss.backward()
    assert torch.isfinite(loss)


def test_site_names_follow_module_path_and_are_distinct():
    class Net(PyroModule):
        def __init__(self):
            super().__init__()
            self.layers = PyroModule[torch.nn.ModuleList](
                [BMHA(E, H, batch_first=True, family="dirichlet") for _ in range(3)]
            )

        def forward(self, x):
            for layer in self.layers:
                x = x + layer(x, x, x)[0]
            return x

    tr = poutine.trace(Net()).get_trace(torch.randn(2, 4, E))
    names = [n for n, s in tr.nodes.items() if s["type"] == "sample"]
    assert names == ["layers.0.latent", "layers.1.latent", "layers.2.latent"]


def _dirichlet_kl(a, b):
    """KL(Dir(a) || Dir(b)) over the last dim, in closed form."""
    a0, b0 = a.sum(-1), b.sum(-1)
    return (
        torch.lgamma(a0) - torch.lgamma(a).sum(-1) - torch.lgamma(b0) + torch.lgamma(b).sum(-1)
        + ((a - b) * (torch.digamma(a) - torch.digamma(a0).unsqueeze(-1))).sum(-1)
    )


def _normal_kl(mq, sq, mp, sp):
    """KL(N(mq, sq²) || N(mp, sp²)) summed over the last dim, in closed form."""
    return (torch.log(sp / sq) + (sq**2 + (mq - mp) ** 2) / (2 * sp**2) - 0.5).sum(-1)


def _weibull_gamma_kl(k, lam, alpha, beta):
    """KL(Weibull(k, λ) || Gamma(α, β)) summed over the last dim (Fan et al. 2020, eq. 8)."""
    g = 0.5772156649015329  # Euler–Mascheroni
    return (
        g * alpha / k - alpha * lam.log() + k.log() + beta * lam * torch.exp(torch.lgamma(1 + 1 / k))
        - g - 1 - alpha * beta.log() + torch.lgamma(alpha)
    ).sum(-1)


@pytest.mark.parametrize("family", FAMILIES)
def test_elbo_mode_collects_kl(family):
    """The KL collected in ELBO mode is Σ_{h,i} KL(q_hi || p_hi), with q centred on the exact
    posterior p̄ (computed here by torch.nn.MultiheadAttention with the ALiBi log-prior as a
    per-head float mask) and p on the normalised prior π ∝ exp(-m_h|i-j|), in closed form
    (Concrete has none: a large independent Monte-Carlo estimate with torch's
    ExpRelaxedCategorical)."""
    B, T = 2, 5
    m = BMHA(E, H, batch_first=True, family=family, prior=DistanceDecayPrior(H))
    ref = torch.nn.MultiheadAttention(E, H, batch_first=True)
    ref.load_state_dict(m.state_dict(), strict=False)
    x = torch.randn(B, T, E)
    i = torch.arange(T)
    log_pi = -m.prior.slopes.view(H, 1, 1) * (i[:, None] - i[None, :]).abs()  # (H, T, T)
    with torch.no_grad():
        pbar = ref(x, x, x, attn_mask=log_pi.repeat(B, 1, 1), average_attn_weights=False)[1]
    pi = torch.softmax(log_pi, -1).expand(B, H, T, T)  # (B, H, Tq, Tk)
    fam, n = m.family, T
    num = 4000 if family == "concrete" else None
    with torch.no_grad(), collect_kl() as col:
        m(x, x, x, num_samples=num)
    kl = col.total()  # (B,) or (S, B)
    if family == "dirichlet":
        kappa = fam.log_concentration.exp().view(1, H, 1, 1)
        expect = _dirichlet_kl(kappa * n * pbar, fam.model_concentration * n * pi)
    elif family == "logistic_normal":
        sq = torch.nn.functional.softplus(fam.scale_bias).view(1, H, 1, 1).expand_as(pbar)
        expect = _normal_kl(pbar.log(), sq, pi.log(), torch.full_like(pi, fam.model_scale))
    elif family == "weibull":
        k = fam.shape_k.view(1, H, 1, 1).expand_as(pbar)
        lam = pbar / torch.exp(torch.lgamma(1 + 1 / k))  # E[g] = p̄
        c = fam.model_concentration * n
        expect = _weibull_gamma_kl(k, lam, c * pi, torch.full_like(pi, c))
    else:  # E_q[log q - log p], independent draws and densities
        q = ExpRelaxedCategorical(
            torch.tensor(fam.temperature), probs=pbar
        )
        p = ExpRelaxedCategorical(
            torch.tensor(fam.model_temperature), probs=pi
        )
        z = q.sample((num,))
        mc = (q.log_prob(z) - p.log_prob(z)).sum((-2, -1))  # (S, B)
        se = (kl.var(0) / num + mc.var(0) / num).sqrt()
        assert kl.shape == (num, B)
        assert torch.all((kl.mean(0) - mc.mean(0)).abs() < 4 * se), (kl.mean(0), mc.mean(0), se)
        return
    assert kl.shape == (B,)
    torch.testing.assert_close(kl, expect.sum((-2, -1)), atol=1e-4, rtol=1e-4)
    assert torch.all(kl > 0)


def test_priors_with_sample_dims_contextual():
    """A leading sample dim: each slice is the layer applied to that slice (mean mode), and the
    stochastic output is out_proj(w @ V) of the per-head weights it returns."""
    m = BMHA(E, H, batch_first=True, family="weibull", prior=ContextualPrior(E // H))
    x = torch.randn(7, 2, 5, E)  # extra leading sample dim
    y, w = m(x, x, x)
    assert y.shape == (7, 2, 5, E) and w.shape == (7, 2, 5, 5)
    with torch.no_grad():
        with attention_mode("mean"):
            ym, wm = m(x, x, x, average_attn_weights=False)
            for s in (0, 6):
                ys, ws = m(x[s], x[s], x[s], average_attn_weights=False)
                torch.testing.assert_close(ym[s], ys, atol=1e-5, rtol=0)
                torch.testing.assert_close(wm[s], ws, atol=1e-6, rtol=0)
        y, w = m(x, x, x, average_attn_weights=False)  # (7, 2, 5, E), (7, 2, H, 5, 5)
        torch.testing.assert_close(w.sum(-1), torch.ones(7, 2, H, 5))
        v = x @ m.in_proj_weight[2 * E :].T + m.in_proj_bias[2 * E :]  # (7, 2, 5, E)
        vh = v.view(7, 2, 5, H, E // H).transpose(-3, -2)  # (7, 2, H, 5, Dh)
        o = (w @ vh).transpose(-3, -2).reshape(7, 2, 5, E)
        torch.testing.assert_close(y, m.out_proj(o), atol=1e-5, rtol=0)
        assert (w - wm).abs().amax() > 1e-3  # the weights were sampled, not the mean


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: BMHA(10, 3), "divisible by num_heads.*embed_dim=10, num_heads=3"),
        (lambda: BMHA(0, 1), "embed_dim must be a positive int"),
        (lambda: BMHA(8, 2, dropout=1.5), "dropout"),
        (lambda: BMHA(8, 2, kdim=-1), "kdim"),
        (lambda: BMHA(8, 2, family="gaussian"), "family must be one of"),
        (lambda: BMHA(8, 2, family=3), "family must be None"),
        (lambda: BMHA(8, 2, prior="causal"), "prior must be a KeyRelevancePrior"),
    ],
)
def test_constructor_errors(make, match):
    with pytest.raises((ValueError, TypeError), match=match):
        make()


def test_forward_errors_name_argument_and_shapes():
    m = BMHA(E, H, batch_first=True)
    x = torch.randn(2, 5, E)
    with pytest.raises(ValueError, match=r"query last dim must be 16; got shape \(2, 5, 8\)"):
        m(x[..., :8], x, x)
    with pytest.raises(ValueError, match="same batch size"):
        m(x, x[:1], x[:1])
    with pytest.raises(ValueError, match="key and value must share"):
        m(x, x, x[:, :3])
    with pytest.raises(ValueError, match=r"key_padding_mask shape must be \(B, Tk\) = \(2, 5\)"):
        m(x, x, x, key_padding_mask=torch.zeros(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"attn_mask 2-D shape must be \(Tq, Tk\)"):
        m(x, x, x, attn_mask=torch.zeros(5, 4, dtype=torch.bool))
    with pytest.raises(TypeError, match="attn_mask must be a bool or floating"):
        m(x, x, x, attn_mask=torch.zeros(5, 5, dtype=torch.long))
    with pytest.raises(TypeError, match="query must be floating point"):
        m(x.long(), x, x)
    bad = x.clone()
    bad[0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="query must be finite; got 1 NaN"):
        m(bad, x, x)
    pyro.enable_validation(False)
    try:
        m(bad, x, x)  # validation off: no check (like pyro.enable_validation)
    finally:
        pyro.enable_validation(True)
    with pytest.raises(ValueError, match="num_samples"):
        BMHA(E, H, batch_first=True, family="dirichlet")(x, x, x, num_samples=0)
    with pytest.raises(ValueError, match="mode must be one of"):
        with attention_mode("sample"):
            pass
