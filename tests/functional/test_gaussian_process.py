"""Sparse-GP global posteriors: the maths against dense Gaussian-process computations and closed
forms, the Pyro/ELBO plumbing (global site outside the data plate, KL charged once), and a task
where the posterior's spread is larger off the training data than on it."""

from __future__ import annotations

import pyro
import pytest
import torch
from torch.distributions import MultivariateNormal, kl_divergence

from bayesattn import AttentionConfig, TransformerClassifier
from bayesattn.functional.gaussian_process import (
    get_covariance,
    matern52_covariance,
    rbf_covariance,
    sparse_gp_marginals,
    whitened_kl,
    whitened_projection,
)
from bayesattn.nn.attention import BayesianMultiheadAttention
from bayesattn.nn.gp_read import SparseGP
from bayesattn.nn.modes import attention_mode, collect_kl, global_values
from bayesattn.uncertainty import predict

D64 = torch.float64


def _dense_posterior(X, y, noise, xs, cov, ls, os):
    """Exact GP regression posterior at xs (an independent dense computation)."""
    K = cov(X, X, ls, os) + noise * torch.eye(len(X), dtype=D64)
    Ks = cov(xs, X, ls, os)
    mean = Ks @ torch.linalg.solve(K, y)
    var = os - (Ks * torch.linalg.solve(K, Ks.T).T).sum(-1)
    return mean, var


@pytest.mark.parametrize("name", ["rbf", "matern52"])
def test_sparse_gp_with_exact_inducing_posterior_equals_dense_gp(name):
    """With the inducing inputs at the training inputs and q(u) the exact posterior over u, the
    sparse GP's predictive is the dense GP's, to 1e-6 in float64."""
    g = torch.Generator().manual_seed(0)
    X = torch.rand(12, 3, generator=g, dtype=D64) * 4  # (M, D)
    y = torch.randn(12, 2, generator=g, dtype=D64)  # (M, P)
    xs = torch.rand(9, 3, generator=g, dtype=D64) * 5
    ls, os, noise = torch.tensor(1.3, dtype=D64), torch.tensor(0.7, dtype=D64), 0.1
    cov = get_covariance(name)
    Kzz = cov(X, X, ls, os)
    Lz = torch.linalg.cholesky(Kzz)
    Kn = Kzz + noise * torch.eye(12, dtype=D64)
    # exact posterior of u = f(X), whitened (v = L^{-1} u): m = L^T Kn^{-1} y, S = I - L^T Kn^{-1} L
    m = Lz.T @ torch.linalg.solve(Kn, y)
    S = torch.eye(12, dtype=D64) - Lz.T @ torch.linalg.solve(Kn, Lz)
    Ls = torch.linalg.cholesky((S + S.T) / 2)
    a, r = whitened_projection(xs[None], X[None], ls[None], os[None], name, jitter=0.0)
    mean, var = sparse_gp_marginals(a, r, m.T[None], Ls[None])  # (1, N, P), (1, N)
    dmean, dvar = _dense_posterior(X, y, noise, xs, cov, ls, os)
    torch.testing.assert_close(mean[0], dmean, atol=1e-6, rtol=0)
    torch.testing.assert_close(var[0], dvar, atol=1e-6, rtol=0)


def test_covariances_closed_forms():
    x1, x2 = torch.tensor([[0.0, 0.0]], dtype=D64), torch.tensor([[3.0, 4.0]], dtype=D64)
    ls, os = torch.tensor([2.0], dtype=D64), torch.tensor([1.5], dtype=D64)
    r = 5.0 / 2.0
    assert float(rbf_covariance(x1, x2, ls, os)) == pytest.approx(
        1.5 * torch.exp(torch.tensor(-r * r / 2)).item()
    )
    s5 = 5**0.5
    expect = 1.5 * (1 + s5 * r + 5 * r * r / 3) * torch.exp(torch.tensor(-s5 * r)).item()
    assert float(matern52_covariance(x1, x2, ls, os)) == pytest.approx(expect)
    with pytest.raises(ValueError, match="covariance"):
        get_covariance("periodic")  # type: ignore[arg-type]


def test_variance_reverts_to_prior_far_from_inducing_keys():
    """Far from every inducing input the posterior variance is the prior's sigma^2 and the mean
    0, whatever q(v) learned; at an inducing input it is the learned one."""
    torch.manual_seed(0)
    gp = SparseGP(2, 4, 3, num_inducing=6, outputscale=2.0, lengthscale=0.5).double()
    with torch.no_grad():
        gp.q_mean.normal_()
        gp.q_tril_rawdiag.fill_(-4.0)  # a confident posterior: S ≈ 0.018² I
    far = gp.inducing.detach()[:, :1] + 100.0  # (G, 1, D)
    mean, var = (t.detach() for t in gp.marginals(far))
    torch.testing.assert_close(
        var, gp.outputscale.detach()[:, None].expand(2, 1), atol=1e-8, rtol=0
    )
    assert float(mean.abs().max()) < 1e-8
    near_mean, near_var = gp.marginals(gp.inducing.detach()[:, :1])
    assert float(near_var.max()) < 0.01 * float(var.min())


def test_kl_matches_torch_closed_form():
    torch.manual_seed(1)
    gp = SparseGP(3, 2, 4, num_inducing=5).double()
    with torch.no_grad():
        gp.q_mean.normal_()
        gp.q_tril_offdiag.normal_()
        gp.q_tril_rawdiag.normal_()
    L = gp.q_scale_tril()  # (G, M, M)
    q = MultivariateNormal(gp.q_mean, scale_tril=L.unsqueeze(1).expand(3, 4, 5, 5))
    p = MultivariateNormal(
        torch.zeros_like(gp.q_mean), scale_tril=torch.eye(5, dtype=D64).expand(3, 4, 5, 5)
    )
    expect = kl_divergence(q, p).sum()
    torch.testing.assert_close(gp.kl(), expect)
    torch.testing.assert_close(whitened_kl(gp.q_mean, L), expect)
    torch.testing.assert_close(kl_divergence(gp.posterior(), gp.prior()), expect)
    with pytest.raises(ValueError, match="q_scale_tril"):
        whitened_kl(gp.q_mean, L[:, :4, :4])


def test_sampled_read_matches_its_marginals():
    """Draws in "guide" mode (one global value per sample, conditional noise per input) have the
    closed-form posterior mean and variance (Monte Carlo, 20000 draws)."""
    torch.manual_seed(2)
    gp = SparseGP(1, 2, 1, num_inducing=4).double()
    with torch.no_grad():
        gp.q_mean.normal_()
        gp.q_tril_rawdiag.fill_(-1.0)
    x = torch.randn(1, 3, 2, dtype=D64)  # (G, N, D)
    with attention_mode("guide"), pyro.poutine.block(), torch.no_grad():
        f = gp(x, num_samples=20000)  # (S, G, N, P)
    mean, var = gp.marginals(x)
    torch.testing.assert_close(f.mean(0), mean.detach(), atol=0.03, rtol=0)
    torch.testing.assert_close(f.var(0)[..., 0], var.detach(), atol=0.03, rtol=0.05)
    with attention_mode("mean"):
        torch.testing.assert_close(gp(x), mean.detach())


#: the SGPA read of the one (last) layer: a global site (G=2 heads, P=Dh=4, M=8)
_SITE = "encoder.layers.0.self_attn.gp_read.inducing_values"


def _gp_net(seed: int = 0) -> TransformerClassifier:
    """CLS pooling: the last layer computes the CLS row only and draws the ``S`` samples itself,
    one global value per sample (as the study's ``sgpa``)."""
    torch.manual_seed(seed)
    cfg = AttentionConfig(read="sparse_gp", layers="last", read_kwargs={"num_inducing": 8})
    return TransformerClassifier(
        2, input_dim=2, d_model=8, nhead=2, num_layers=1, dim_feedforward=16, dropout=0.0,
        max_len=4, pooling="cls", attention=cfg,
    ).double()  # fmt: skip


def _gp(net: TransformerClassifier) -> SparseGP:
    gp = net.encoder.layers[0].self_attn.gp_read
    assert isinstance(gp, SparseGP)
    return gp


def test_elbo_charges_global_kl_once_and_scales_likelihood_by_n_over_b():
    """loss = -(N/B) sum_b log p(y_b | ...) + beta KL_global: two num_data with the same draws
    identify both terms; the KL part is the closed form, not scaled by N/B."""
    net = _gp_net().eval()  # eval: no initialisation from the first batch between the calls
    gp = _gp(net)
    with torch.no_grad():
        gp.q_mean.normal_()  # KL(q || p) well away from 0
    x, y = torch.randn(6, 3, 2, dtype=D64), torch.tensor([0, 1, 0, 1, 1, 0])
    losses = {}
    for n in (6, 60):
        torch.manual_seed(3)
        losses[n] = net.elbo_loss(x, y, num_data=n, beta=0.5)[0]
    ll = (losses[6] - losses[60]) * 6 / (60 - 6)  # sum_b log p(y_b | ...)
    kl = (losses[6] + ll) / 0.5
    torch.testing.assert_close(kl, gp.kl(), atol=1e-9, rtol=0)
    assert float(gp.kl()) > 1.0  # so a KL scaled by N/B would be caught
    # the global site is drawn once per pass even with S samples
    with collect_kl() as col:
        net.forward_logits(x, None, 3)
    assert list(col.global_terms) == [_SITE]
    assert col.global_values[_SITE].shape == (3, 2, 4, 8)


def test_svi_trace_keeps_the_global_site_outside_the_data_plate():
    net = _gp_net()
    x, y = torch.randn(4, 3, 2, dtype=D64), torch.tensor([0, 1, 0, 1])
    pyro.clear_param_store()
    gtr = pyro.poutine.trace(net.guide).get_trace(x, y, 40)
    mtr = pyro.poutine.trace(pyro.poutine.replay(net.model, trace=gtr)).get_trace(x, y, 40)
    site = _SITE
    for tr in (gtr, mtr):
        assert tr.nodes[site]["scale"] == 1.0 and not tr.nodes[site]["cond_indep_stack"]
    assert mtr.nodes["obs"]["scale"] == pytest.approx(10.0)  # N / B
    assert gtr.nodes[site]["value"].shape == (2, 4, 8)


def test_predict_shares_one_global_draw_per_sample_across_batches():
    """predict draws the inducing values once, ``(S, ...)``, and every chunk reads the same."""
    net = _gp_net().eval()
    gp = _gp(net)
    x = torch.randn(10, 3, 2, dtype=D64)
    seen = []
    orig = gp._value

    def spy(mode, n):
        v = orig(mode, n)
        seen.append(v)
        return v

    gp._value = spy  # type: ignore[method-assign]
    predict(net, x, num_samples=5, batch_size=3, keep_attention=False)
    assert len(seen) == 4 and all(v.shape == (5, 2, 4, 8) for v in seen)
    assert all(v is seen[0] for v in seen)  # the same draws for every chunk


def test_attention_gp_read_shapes_modes_and_validation():
    torch.manual_seed(0)
    gp = SparseGP(2, 4, 4, num_inducing=5)
    mha = BayesianMultiheadAttention(8, 2, batch_first=True, gp_read=gp)
    assert mha.is_bayesian
    x = torch.randn(3, 5, 8)
    with pyro.poutine.block():
        y, w = mha(x, x, x, num_samples=4)
    assert y.shape == (4, 3, 5, 8) and w.shape == (4, 3, 5, 5)
    assert float((y[0] - y[1]).abs().max()) > 0  # draws differ
    with attention_mode("mean"):
        ym, _ = mha(x, x, x)
        ys, _ = mha(x, x, x, num_samples=2)
    assert ym.shape == (3, 5, 8) and torch.equal(ys[0], ys[1])
    # mean mode: softmax attention + out_proj(merged heads of the GP's mean function a^T m)
    with torch.no_grad():
        gp.q_mean.normal_()
    plain = BayesianMultiheadAttention(8, 2, batch_first=True)
    plain.load_state_dict({k: v for k, v in mha.state_dict().items() if "gp_read" not in k})
    with attention_mode("mean"), torch.no_grad():
        ym, _ = mha(x, x, x)
        q = mha._projections(x, x, x, True)[0].reshape(3, 5, 2, 4).transpose(1, 2)  # (B,H,T,Dh)
        mean_f = gp.marginals(q)[0].transpose(1, 2).reshape(3, 5, 8)  # (B, T, E)
        expect = plain(x, x, x)[0] + mean_f @ mha.out_proj.weight.T
    torch.testing.assert_close(ym, expect)
    with pytest.raises(ValueError, match="gp_read"):
        BayesianMultiheadAttention(8, 2, gp_read=SparseGP(3, 4, 4))
    with pytest.raises(TypeError, match="gp_read"):
        BayesianMultiheadAttention(8, 2, gp_read=torch.nn.Linear(2, 2))  # type: ignore[arg-type]


def test_gp_read_draws_one_global_value_per_sample_of_an_input_with_sample_dims():
    """An input that already carries a sample dim ``(S, B, T, E)`` (no ``num_samples``) gets S
    draws of the global inducing values, as ``num_samples=S`` on a plain input does: the
    function differs across samples, not only its independent noise."""
    torch.manual_seed(0)
    gp = SparseGP(2, 4, 4, num_inducing=5)
    mha = BayesianMultiheadAttention(8, 2, batch_first=True, gp_read=gp)
    seen = []
    value = gp._value
    gp._value = lambda mode, n: seen.append(n) or value(mode, n)  # type: ignore[method-assign]
    x = torch.randn(3, 5, 8)
    with pyro.poutine.block():
        y, _ = mha(x.expand(4, 3, 5, 8), x.expand(4, 3, 5, 8), x.expand(4, 3, 5, 8))
        mha(x, x, x, num_samples=4)
    assert y.shape == (4, 3, 5, 8) and seen == [4, 4]


def test_attention_config_validates_gp_options():
    with pytest.raises(ValueError, match="read must be one of"):
        AttentionConfig(read="gp")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not options of read="):
        AttentionConfig(read="sparse_gp", read_kwargs={"inducing": 3})
    # readout had one value, "linear": deprecated; the dropped read-outs stay errors
    with pytest.warns(DeprecationWarning, match="readout"):
        cfg = AttentionConfig(readout="linear")
    assert cfg == AttentionConfig() and "readout" not in repr(cfg)
    for dropped in ("sparse_gp", "random_features", "epinet"):
        with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="readout must") as e:
            AttentionConfig(readout=dropped)
        assert f"got {dropped!r}" in str(e.value)
    with pytest.warns(DeprecationWarning), pytest.raises(
        ValueError, match="readout_kwargs \\['index_dim'\\] given with readout='linear'"
    ):
        AttentionConfig(readout_kwargs={"index_dim": 3})
    with pytest.warns(DeprecationWarning, match="build_readout"):
        head = AttentionConfig().build_readout(4, 3)
    assert isinstance(head, torch.nn.Linear) and head.weight.shape == (3, 4)
    with pytest.raises(ValueError, match="given with read='softmax'"):
        AttentionConfig(read_kwargs={"num_inducing": 3})
    with pytest.raises(ValueError, match="num_inducing"):
        AttentionConfig(read="sparse_gp", read_kwargs={"num_inducing": 0})
    with pytest.raises(ValueError, match="support"):
        AttentionConfig(read="sparse_gp", support="local")
    cfg = AttentionConfig(read="sparse_gp", layers="last")
    net = TransformerClassifier(2, vocab_size=5, d_model=8, nhead=2, num_layers=2, attention=cfg)
    assert net.bayesian_layers == ["encoder.layers.1.self_attn"]
    with net.pyro_context:  # site names are module paths, defined inside the network's context
        names = [m.site_name for m in net.global_latents()]
    assert names == ["encoder.layers.1.self_attn.gp_read.inducing_values"]


def test_global_posterior_spread_is_larger_off_the_training_data():
    """A sparse GP whose outputs are the logits, trained by the ELBO on inputs near the origin: its
    posterior variance (and the predictive's mutual information) is much larger far from them
    than on them. Inputs ``(B, G=1, N=1, D)``, so ``f(x)`` is ``(*, B, 1, 1, C)``."""

    def logits_of(z, **kw):
        return gp(z[..., None, None, :], **kw)[..., 0, 0, :]  # (*, B, C)

    torch.manual_seed(0)
    gp = SparseGP(1, 2, 2, num_inducing=10, init_mean=1.0, init_scale=0.3)  # m != 0: trains
    x = torch.randn(200, 2) * 0.7
    y = (x[:, 0] > 0).long()
    opt = torch.optim.Adam(gp.parameters(), lr=0.05)
    gp.train()
    for _ in range(150):
        opt.zero_grad()
        with collect_kl() as col:
            logits = logits_of(x)
        ll = torch.distributions.Categorical(logits=logits).log_prob(y).sum()
        (-(ll) + col.global_total()).backward()
        opt.step()
    gp.eval()
    far = torch.randn(200, 2) * 0.7 + torch.tensor([6.0, 6.0])
    _, var_on = gp.marginals(x[:, None, None, :])
    _, var_off = gp.marginals(far[:, None, None, :])
    assert float(var_off.mean()) > 3 * float(var_on.mean())
    with torch.no_grad(), attention_mode("guide"), pyro.poutine.block():
        v = gp.posterior().sample((64,))
        with global_values({gp.site_name: v}):
            p_on = torch.softmax(logits_of(x.expand(64, 200, 2), leading_samples=64), -1)
            p_off = torch.softmax(logits_of(far.expand(64, 200, 2), leading_samples=64), -1)

    def mi(p):
        ent = lambda q: -(q * q.clamp_min(1e-12).log()).sum(-1)  # noqa: E731
        return ent(p.mean(0)) - ent(p).mean(0)

    assert float(mi(p_off).mean()) > 3 * float(mi(p_on).mean())
    assert float(gp.kl()) > 1.0  # the posterior moved away from the prior


@pytest.mark.slow
def test_ddp_two_processes_keep_the_global_posterior_in_sync(tmp_path):
    """2-process DDP (gloo, CPU): both ranks scale the ELBO to the full data set, start from
    rank 0's data-initialised inducing inputs, and end with identical global posteriors."""
    import os
    import socket
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("lightning")
    root = Path(__file__).resolve().parents[2]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(
        os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port), PYTHONPATH=str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    )  # fmt: skip
    for k in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "NODE_RANK", "SLURM_NTASKS", "SLURM_JOB_ID"):
        env.pop(k, None)
    out = tmp_path / "ddp"
    proc = subprocess.run(
        [sys.executable, str(root / "tests" / "functional" / "ddp_gp_run.py"), "--out", str(out)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, f"DDP run failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    r0, r1 = (torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2))
    assert r0["world"] == 2 and r0["num_data"] == r1["num_data"] == 32  # not the 16-example shard
    assert bool(r0["state"]["encoder.layers.0.self_attn.gp_read.initialised"])
    for k, v in r0["state"].items():
        torch.testing.assert_close(v, r1["state"][k], atol=1e-12, rtol=0, msg=k)
    assert r0["kl"] > 0.0


def test_random_fourier_features_approximate_the_rbf_covariance():
    from bayesattn.functional.gaussian_process import random_fourier_features

    g = torch.Generator().manual_seed(0)
    R, D = 40000, 3
    W, b = (
        torch.randn(R, D, generator=g, dtype=D64),
        2 * torch.pi * torch.rand(R, generator=g, dtype=D64),
    )
    x = torch.randn(5, D, generator=g, dtype=D64)
    ls, os = torch.tensor(1.5, dtype=D64), torch.tensor(2.0, dtype=D64)
    phi = random_fourier_features(x, W, b, ls, os)
    torch.testing.assert_close(phi @ phi.T, rbf_covariance(x, x, ls, os), atol=0.05, rtol=0)


def _toy_frozen_model() -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    """A small classifier trained the ordinary way on a noisy 2-D task: (model, x, y)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(2, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
    x = torch.randn(400, 2)
    y = (x[:, 0] + 0.3 * torch.randn(400) > 0).long()
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    for _ in range(100):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return model, x, y


def test_posthoc_gp_read_on_a_frozen_torch_model():
    """Fitted on a calibration split of a frozen model: the model is unchanged, predictions on
    the calibration inputs are those of temperature scaling up to small noise, and far from them
    the samples disagree (mutual information) while they barely do on them."""
    from bayesattn import calibration as C
    from bayesattn.posthoc._gp_core import fit_posthoc_gp

    model, x, y = _toy_frozen_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    read = fit_posthoc_gp(model, x[:300], y[:300], model[2], seed=0)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    assert not model[2]._forward_pre_hooks  # the hook is gone
    p_in = read.sample_probs(x[300:], 64, seed=1)  # (S, B, C)
    far = torch.randn(100, 2) * 0.5 + torch.tensor([0.0, 8.0])
    p_far = read.sample_probs(far, 64, seed=2)
    assert p_in.shape == (64, 100, 2)
    with torch.no_grad():
        ts = torch.softmax(model(x[300:]) / read.temperature, -1)
    assert float((p_in.mean(0) - ts).abs().mean()) < 0.05

    def mi(p):
        ent = lambda q: -(q * q.clamp_min(1e-12).log()).sum(-1)  # noqa: E731
        return ent(p.mean(0)) - ent(p).mean(0)

    assert float(mi(p_far).mean()) > 5 * float(mi(p_in).mean())
    assert float(read.variance(far).mean()) > 5 * float(read.variance(x[300:]).mean())
    assert C.ood_auroc(mi(p_in), mi(p_far)) > 0.9
    with pytest.raises(TypeError, match="head"):
        fit_posthoc_gp(model, x, y, "2")  # type: ignore[arg-type]


def test_posthoc_gp_half_variance_is_the_dense_gp_variance_of_each_half():
    """``half_variance`` against a dense Gaussian process on each half of the calibration split
    (covariance ``K = ΦΦᵀ`` of the read's random features, unit noise): the mean over the two
    halves of ``k(x,x) − k_xᵀ(K + I)⁻¹k_x``, to 1e-6 in float64."""
    from bayesattn.posthoc._gp_core import fit_posthoc_gp

    model, x, y = _toy_frozen_model()
    read = fit_posthoc_gp(model.double(), x[:300].double(), y[:300], model[2], seed=0)
    assert read.half_tril is not None and read.half_tril.shape == (256, 256)
    with torch.no_grad():
        phi_cal = read.features(model[1](model[0](x[:300].double())))  # (N, R)
        phi = read.features(model[1](model[0](x[300:].double())))  # (B, R)
    dense = []
    for rows in (torch.arange(0, 300, 2), torch.arange(1, 300, 2)):
        P = phi_cal[rows]
        K, k = P @ P.T, P @ phi.T  # (n, n), (n, B)
        prior = (phi * phi).sum(-1)
        dense.append(
            prior - (k * torch.linalg.solve(K + torch.eye(len(rows), dtype=D64), k)).sum(0)
        )
    want = torch.stack(dense).mean(0)
    torch.testing.assert_close(read.half_variance(phi), want, atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match=r"phi must be .*\(B, 256\).*got \(100, 2\)"):
        read.half_variance(x[300:].double())  # raw inputs, not the read's features


def test_posthoc_gp_mean_field_predictive():
    """The mean-field predictive is ``softmax(z / (T_mf √(1 + a v)))``: with ``a = 0`` it is
    temperature scaling at ``T_mf``; with ``a > 0`` (here 10) every input is flatter than that
    (entropy up), most where the variance is high, far from the calibration inputs (OOD AUROC
    > 0.9); the fitted ``(T_mf, a)`` minimise the NLL (no grid point does better) and ``a`` grows
    when errors grow with the variance; a one-example split falls back to temperature scaling."""
    from bayesattn import calibration as C
    from bayesattn.posthoc import _gp_core as P

    model, x, y = _toy_frozen_model()
    read = P.fit_posthoc_gp(model, x[:300], y[:300], model[2], seed=0)
    assert read.mf_temperature > 0 and read.mf_scale >= 0
    far = torch.randn(100, 2) * 0.5 + torch.tensor([0.0, 8.0])
    with torch.no_grad():
        z = model(x[300:])
    read.mf_scale = 0.0
    torch.testing.assert_close(read.probs(x[300:]), torch.softmax(z / read.mf_temperature, -1))
    ts_in, ts_far = read.probs(x[300:]), read.probs(far)
    read.mf_scale = 10.0
    p_in, p_far = read.probs(x[300:]), read.probs(far)  # (B, C)
    assert p_in.shape == (100, 2) and torch.allclose(p_in.sum(-1), torch.ones(100))
    H = C.predictive_entropy
    assert bool((H(p_far) >= H(ts_far) - 1e-6).all()) and bool((H(p_in) >= H(ts_in) - 1e-6).all())
    assert float((H(p_far) - H(ts_far)).mean()) > 3 * float((H(p_in) - H(ts_in)).mean())
    assert C.ood_auroc(H(p_in), H(p_far)) > 0.9

    g = torch.Generator().manual_seed(0)
    zz = 3 * torch.randn(200, 3, generator=g, dtype=D64)
    v = torch.rand(200, generator=g, dtype=D64) * 4
    yy = torch.where(
        torch.rand(200, generator=g) < 0.3 + 0.15 * v,
        torch.randint(0, 3, (200,), generator=g),
        zz.argmax(-1),
    )
    T, a = P._fit_mean_field(zz, v, yy)

    def nll(t: float, s: float) -> float:
        return float(torch.nn.functional.cross_entropy(P._mean_field(zz, v, t, s), yy))

    best = min(
        nll(t, s)
        for t in torch.linspace(0.2, 3, 57).tolist()
        for s in torch.linspace(0, 5, 51).tolist()
    )
    assert a > 0.1 and nll(T, a) <= best + 1e-9  # errors grow with v: the fit flattens there

    one = P.fit_posthoc_gp(model, x[:1], y[:1], model[2], seed=0)
    assert one.half_tril is None and one.mf_scale == 0.0
    torch.testing.assert_close(
        one.probs(x[:5]), torch.softmax(model(x[:5]).detach() / one.temperature, -1)
    )


class _TorchModel(torch.nn.Module):
    """A plain torch model (trained elsewhere) for the converted-model tests."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Linear(4, 8)
        self.layer = torch.nn.TransformerEncoderLayer(8, 2, 16, 0.0, batch_first=True)
        self.head = torch.nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.layer(self.embed(x)).mean(-2))


def test_gp_read_on_a_converted_torch_model():
    """convert() then a GP read on the converted layer: the site is named by module path and the
    vectorised predictive draws one global value per sample."""

    import bayesattn

    torch.manual_seed(0)
    model = _TorchModel().eval()
    bayesattn.convert(model)
    att = model.layer.self_attn
    att.gp_read = SparseGP(2, 4, 4)
    assert att.gp_read.site_name == "layer.self_attn.gp_read.inducing_values"
    x = torch.randn(5, 6, 4)
    res = predict(model, x, num_samples=4, vectorised=True)
    assert res.probs.shape == (4, 5, 3) and float(res.mutual_information.mean()) > 0
    with collect_kl() as col:
        model(x)
    assert list(col.global_terms) == ["layer.self_attn.gp_read.inducing_values"]


def test_fit_posthoc_charges_a_gp_reads_global_kl_once_per_data_set():
    """fit_posthoc's loss is the negative ELBO per example: mean(NLL + local KL) + KL_global / n,
    checked against the same draws recomputed by hand."""
    from torch import nn

    import bayesattn
    from bayesattn._validation import torch_generator
    from bayesattn.posthoc._svi_core import family_parameters, fit_posthoc

    torch.manual_seed(0)
    model = _TorchModel().eval()
    bayesattn.convert(model)
    model.layer.self_attn.gp_read = gp = SparseGP(2, 4, 4)
    with torch.no_grad():
        gp.q_mean.normal_()  # q(u) away from the prior: a KL of some nats
    n = 12
    x, y = torch.randn(n, 6, 4), torch.randint(0, 3, (n,))
    torch.manual_seed(1)
    cal = fit_posthoc(model, x, y, steps=1, batch_size=5, seed=0, lr=1e-12)
    idx = torch.randint(0, n, (5,), generator=torch_generator(0))
    torch.manual_seed(1)
    with collect_kl() as col:
        logits = model(x[idx])
    glob = float(col.global_total())
    assert glob > 1.0
    nll = nn.functional.cross_entropy(logits, y[idx], reduction="none")
    expected = (nll + col.total()).mean() + glob / n
    assert cal.history[0] == pytest.approx(float(expected), rel=1e-5)
    assert cal.history[0] - float((nll + col.total()).mean()) == pytest.approx(glob / n, rel=1e-4)
    assert any(p is gp.q_mean for p in family_parameters(model))  # the read is fitted too


# ---- issue 33: round 4 ------------------------------------------------------------------------
def test_gp_maths_refuse_non_positive_scales_negative_jitter_and_non_triangular_factors():
    from bayesattn.functional import gaussian_process as G

    x, z = torch.randn(1, 3, 2), torch.randn(1, 4, 2)
    one, t = torch.ones(1), torch.tensor
    for ls in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="lengthscale must be finite and > 0"):
            G.rbf_covariance(x[0], z[0], t(ls), t(1.0))
        with pytest.raises(ValueError, match="lengthscale"):
            G.whitened_projection(x, z, t([ls]), one)
        with pytest.raises(ValueError, match="lengthscale"):
            G.random_fourier_features(x[0], torch.randn(5, 2), torch.rand(5), t(ls), t(1.0))
    with pytest.raises(ValueError, match="outputscale must be finite and > 0"):
        G.matern52_covariance(x[0], z[0], t(1.0), t(-1.0))
    with pytest.raises(ValueError, match="outputscale"):
        G.random_fourier_features(x[0], torch.randn(5, 2), torch.rand(5), t(1.0), t(-1.0))
    with pytest.raises(ValueError, match="jitter must be a number >= 0"):
        G.whitened_projection(x, z, one, one, jitter=-1.0)
    full = torch.ones(1, 4, 4)  # not a Cholesky factor
    with pytest.raises(ValueError, match="lower-triangular"):
        G.whitened_kl(torch.zeros(1, 2, 4), full)
    a, r = G.whitened_projection(x, z, one, one)
    with pytest.raises(ValueError, match="lower-triangular"):
        G.sparse_gp_marginals(a, r, torch.zeros(1, 2, 4), full)
    # the valid calls: variance >= 0 everywhere, KL >= 0
    _, var = G.sparse_gp_marginals(a, r, torch.zeros(1, 2, 4), torch.eye(4)[None] * 0.5)
    assert bool((var >= 0).all())
    assert float(G.whitened_kl(torch.randn(1, 2, 4), torch.eye(4)[None] * 0.5)) >= 0


class _Tiny(torch.nn.Module):
    def __init__(self, zero: bool = False) -> None:
        super().__init__()
        self.zero = zero
        self.emb = torch.nn.Embedding(6, 8)
        self.head = torch.nn.Linear(8, 3)

    def forward(self, x):
        h = self.emb(x).mean(-2)
        return self.head(0 * h if self.zero else h)


def test_posthoc_gp_edge_inputs_get_clear_errors_or_finite_reads():
    from bayesattn.posthoc._gp_core import fit_posthoc_gp

    torch.manual_seed(0)
    m = _Tiny()
    x, y = torch.randint(0, 6, (16, 4)), torch.randint(0, 3, (16,))
    # identical features (every input the same) and all-zero features: a finite read
    for model, xs in ((m, torch.zeros(16, 4, dtype=torch.long)), (_Tiny(zero=True), x)):
        read = fit_posthoc_gp(model, xs, y, model.head, num_features=16)
        p = read.probs(x)
        assert bool(torch.isfinite(p).all()) and bool((read.variance(x) >= 0).all())
        torch.testing.assert_close(p.sum(-1), torch.ones(16))
    with pytest.raises(ValueError, match="head .* is not a module of the model"):
        fit_posthoc_gp(m, x, y, torch.nn.Linear(8, 3))
    with pytest.raises(ValueError, match="calibration split is empty"):
        fit_posthoc_gp(m, x[:0], y[:0], m.head)
    for scales in ((), (-1.0, 1.0), (0.0,), (float("nan"),)):
        with pytest.raises(ValueError, match="outputscales must be a non-empty sequence"):
            fit_posthoc_gp(m, x, y, m.head, outputscales=scales)
    with pytest.raises(ValueError, match="y_cal must be a 1-D label tensor of length 16"):
        fit_posthoc_gp(m, x, y[:5], m.head)
    with pytest.raises(TypeError, match="y_cal must hold integer class labels"):
        fit_posthoc_gp(m, x, y.float(), m.head)
    with pytest.raises(ValueError, match=r"y_cal must hold labels in \[0, 3\)"):
        fit_posthoc_gp(m, x, y + 3, m.head)
    read = fit_posthoc_gp(m, x, y.int(), m.head, num_features=16)  # int32 labels are fine
    with pytest.raises(ValueError, match="at least one example"):
        read.probs(x[:0])
    with pytest.raises(ValueError, match="phi must be finite"):
        read.half_variance(torch.full((2, 16), float("nan")))


def test_posthoc_gp_refuses_non_finite_inputs_and_is_smallest_near_calibration_points():
    from bayesattn.posthoc._gp_core import fit_posthoc_gp

    torch.manual_seed(0)

    class Feat(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.head = torch.nn.Linear(4, 2)

        def forward(self, x):
            return self.head(x)

    m = Feat()
    with torch.no_grad():  # logits 2·x0 against -2·x0, labels from a noisy x0
        m.head.weight.copy_(torch.tensor([[2.0, 0, 0, 0], [-2.0, 0, 0, 0]]))
        m.head.bias.zero_()
    x = torch.randn(64, 4)
    y = (x[:, 0] + torch.randn(64) < 0).long()
    read = fit_posthoc_gp(m, x, y, m.head, num_features=128)
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match="not finite"):
            read.probs(torch.full((2, 4), bad))
        with pytest.raises(ValueError, match="not finite"):
            read.variance(torch.full((2, 4), bad))
        with pytest.raises(ValueError, match="not finite"):
            read.sample_probs(torch.full((2, 4), bad), 3)
    near, far = read.variance(x[:8]), read.variance(x[:8] * 0 + 40.0)
    assert bool((near >= 0).all()) and float(near.max()) < float(far.min())
