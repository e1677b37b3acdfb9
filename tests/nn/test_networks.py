import pyro
import pytest
import torch
from pyro import poutine
from pyro.infer import Predictive, Trace_ELBO

from bayesattn.nn.blocks import AttentionConfig
from bayesattn.nn.networks import CausalLM, Seq2Seq, TransformerClassifier, VisionTransformer
from bayesattn.nn.weights import bayesian_projections

SMALL = dict(d_model=8, nhead=2, dim_feedforward=16, dropout=0.0)


def _clf(family="dirichlet", num_layers=1, **kw):
    cfg = AttentionConfig(family=family)
    return TransformerClassifier(
        3, vocab_size=7, num_layers=num_layers, attention=cfg, **SMALL, **kw
    )


def _data(B=4, T=3):
    x = torch.randint(1, 7, (B, T))
    x[0, -1] = 0  # one padding token
    return x, torch.randint(0, 3, (B,))


def test_classifier_shapes_all_modes():
    net = _clf()
    x, y = _data()
    assert net(x).shape == (4, 3)
    assert net.elbo_loss(x, y, num_particles=5)[1].shape == (5, 4, 3)
    tr = poutine.trace(net.guide).get_trace(x, y)
    mt = poutine.trace(poutine.replay(net.model, trace=tr)).get_trace(x, y)
    assert mt.nodes["obs"]["value"].shape == (4,)
    assert net.bayesian_layers == ["encoder.layers.0.self_attn"]


def test_deterministic_forward_is_repeatable_and_stochastic_differs():
    net = _clf().eval()
    x, _ = _data()
    torch.testing.assert_close(net(x), net(x))
    from bayesattn.nn.modes import attention_mode

    with attention_mode("guide"):
        assert not torch.allclose(net(x), net(x))


def test_minibatch_scaling_of_the_data_plate():
    net = _clf()
    x, y = _data()
    tr = poutine.trace(net.model).get_trace(x, y, num_data=100)
    assert tr.nodes["obs"]["scale"] == pytest.approx(25.0)
    assert tr.nodes["encoder.layers.0.self_attn.latent"]["scale"] == pytest.approx(25.0)


@pytest.mark.parametrize("family", ["dirichlet", "logistic_normal", "weibull"])
def test_one_pass_elbo_matches_pyro_trace_elbo(family):
    """Second implementation check: E[log p(y|w)] − KL (analytic, one pass) equals Pyro's
    Trace_ELBO (Monte Carlo log p − log q over model and guide traces) in expectation."""
    net = _clf(family)
    x, y = _data()
    torch.manual_seed(1)
    reps, P = 10, 100
    with torch.no_grad():
        ours = torch.stack([net.elbo_loss(x, y, num_particles=P)[0] for _ in range(reps)])
        elbo = Trace_ELBO(num_particles=P, vectorize_particles=True, max_plate_nesting=1)
        pyros = torch.tensor([elbo.loss(net.model, net.guide, x, y) for _ in range(reps)])
    se = (ours.var() / reps + pyros.var() / reps).sqrt()
    assert abs(ours.mean() - pyros.mean()) < 4 * se + 1e-3, (ours.mean(), pyros.mean(), se)


def test_vectorised_and_sequential_particles_agree():
    net = _clf("dirichlet")
    x, y = _data()
    with torch.no_grad():
        vec = Trace_ELBO(num_particles=20, vectorize_particles=True, max_plate_nesting=1)
        seq = Trace_ELBO(num_particles=20, vectorize_particles=False, max_plate_nesting=1)
        a = torch.tensor([vec.loss(net.model, net.guide, x, y) for _ in range(6)])
        b = torch.tensor([seq.loss(net.model, net.guide, x, y) for _ in range(6)])
    se = (a.var() / 6 + b.var() / 6).sqrt()
    assert abs(a.mean() - b.mean()) < 4 * se + 1e-3


def test_predictive_returns_attention_sites_and_obs():
    net = _clf(num_layers=2)
    x, _ = _data()
    pred = Predictive(net.model, guide=net.guide, num_samples=6)(x)
    for i in range(2):
        assert pred[f"encoder.layers.{i}.self_attn.latent"].shape == (6, 4, 2, 3, 3)
        w = pred[f"encoder.layers.{i}.self_attn.weights"]
        assert w.shape == (6, 4, 2, 3, 3)
        assert torch.all(w[:, 0, :, :, -1] == 0)  # padding key gets no attention
    assert pred["obs"].shape == (6, 4)


def test_vit_seq2seq_lm_shapes_and_generate():
    vit = VisionTransformer(
        4, image_size=8, patch_size=2, attention=AttentionConfig("weibull"), **SMALL
    )
    img = torch.rand(3, 8, 8)
    assert vit(img).shape == (3, 4) and vit(img.unsqueeze(1)).shape == (3, 4)
    assert vit.patchify(img).shape == (3, 16, 4)
    s2s = Seq2Seq(6, 7, attention=AttentionConfig("dirichlet"), **SMALL)
    src = torch.randint(3, 6, (2, 4))
    tgt = torch.tensor([[1, 3, 4, 2, 0], [1, 5, 5, 6, 2]])
    assert s2s(src, tgt).shape == (2, 4, 7)
    loss, logits = s2s.elbo_loss(src, tgt, num_particles=3)
    assert logits.shape == (3, 2, 4, 7) and torch.isfinite(loss)
    g = s2s.generate(src, max_len=6, num_samples=5)
    L = g.tokens.shape[1]
    assert g.tokens.shape == (2, L) and g.probs.shape == (2, L, 7) and 1 <= L <= 6
    assert torch.all(g.mutual_information >= 0) and torch.isfinite(g.entropy).all()
    torch.testing.assert_close(
        g.entropy - g.expected_entropy, g.mutual_information, atol=1e-5, rtol=0
    )
    gm = s2s.generate(src, max_len=6, mode="mean")
    assert torch.all(gm.mutual_information.abs() < 1e-6)
    lm = CausalLM(7, attention=AttentionConfig("concrete"), **SMALL)
    assert lm(tgt).shape == (2, 4, 7)
    out = lm.generate(torch.tensor([[1, 3], [1, 4]]), max_len=3, num_samples=4)
    assert out.tokens.shape[0] == 2


def test_generated_tokens_after_eos_are_padding():
    s2s = Seq2Seq(6, 7, attention=AttentionConfig("dirichlet"), **SMALL)
    with torch.no_grad():
        s2s.head.bias.fill_(0)
        s2s.head.bias[2] = 50.0  # always predict EOS
    g = s2s.generate(torch.randint(3, 6, (2, 4)), max_len=5)
    assert torch.all(g.tokens[:, 0] == 2) and g.tokens.shape[1] == 1


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda n, x, y: n.model(x, torch.tensor([0, 1, 2, 3])), r"labels y must be in \[0, 3\)"),
        (lambda n, x, y: n.model(x, y[:3]), r"y must be \(B,\) = \(4,\)"),
        (lambda n, x, y: n(x.float()), "integer token ids"),
        (lambda n, x, y: n(x + 10), r"ids must be in \[0, 7\)"),
        (lambda n, x, y: n(x[0]), r"2-D \(B, T\)"),
        (lambda n, x, y: n.elbo_loss(x, y, num_data=2), "num_data must be an int >= batch size 4"),
        (lambda n, x, y: n.elbo_loss(x, y, num_particles=0), "num_particles"),
        (lambda n, x, y: n(torch.randint(1, 7, (1, 600))), "exceeds max_len"),
    ],
)
def test_network_bad_input(call, match):
    net = _clf()
    x, y = _data()
    with pytest.raises((ValueError, TypeError), match=match):
        call(net, x, y)


def test_network_constructor_errors():
    with pytest.raises(ValueError, match="num_classes"):
        TransformerClassifier(1, vocab_size=5)
    with pytest.raises(ValueError, match="exactly one of vocab_size"):
        TransformerClassifier(2)
    with pytest.raises(ValueError, match="pooling"):
        TransformerClassifier(2, vocab_size=5, pooling="max")
    with pytest.raises(ValueError, match="divisible"):
        TransformerClassifier(2, vocab_size=5, d_model=10, nhead=4)
    with pytest.raises(ValueError, match="image_size must be divisible"):
        VisionTransformer(2, image_size=7, patch_size=2)
    s2s = Seq2Seq(6, 7, **SMALL)
    with pytest.raises(ValueError, match="same batch size"):
        s2s(torch.randint(3, 6, (2, 4)), torch.ones(3, 4, dtype=torch.long))


# ---- weight-space Bayesian projections ------------------------------------------------------


@pytest.mark.parametrize("guide", ["normal", "lowrank"])
def test_bayesian_projections_sites_are_global_and_vectorise(guide):
    net = _clf(num_layers=2)
    names = bayesian_projections(net, guide=guide)
    assert names == [
        "encoder.layers.0.self_attn.in_proj_weight",
        "encoder.layers.0.self_attn.out_proj.weight",
        "encoder.layers.1.self_attn.in_proj_weight",
        "encoder.layers.1.self_attn.out_proj.weight",
    ]
    x, y = _data()
    tr = poutine.trace(net.model).get_trace(x, y, num_data=40)
    for n in names:
        assert tr.nodes[n]["cond_indep_stack"] == ()  # outside the data plate
        assert tr.nodes[n]["scale"] == 1.0
    elbo = Trace_ELBO(num_particles=3, vectorize_particles=True, max_plate_nesting=1)
    assert torch.isfinite(torch.tensor(elbo.loss(net.model, net.guide, x, y)))
    pred = Predictive(net.model, guide=net.guide, num_samples=4, parallel=True)(x)
    assert pred[names[0]].shape[-2:] == (24, 8) and pred["obs"].shape == (4, 4)
    loss, _ = net.elbo_loss(x, y, num_particles=2)
    loss.backward()
    assert any(
        p.grad is not None for n, p in net.named_parameters() if n.startswith("weight_guide")
    )


def test_bayesian_projection_guide_starts_at_current_weights_and_forward_uses_median():
    net = _clf()
    w0 = net.encoder.layers[0].self_attn.in_proj_weight.detach().clone()
    x, _ = _data()
    before = net(x)
    bayesian_projections(net, targets="*in_proj_weight")
    med = net.weight_guide.median()["encoder.layers.0.self_attn.in_proj_weight"]
    torch.testing.assert_close(med, w0)
    torch.testing.assert_close(net(x), before)  # deterministic forward = posterior median


def test_one_pass_elbo_matches_trace_elbo_with_bayesian_weights():
    net = _clf("dirichlet")
    bayesian_projections(net, init_scale=0.05)
    x, y = _data()
    reps, P = 10, 100
    with torch.no_grad():
        ours = torch.stack([net.elbo_loss(x, y, num_particles=P)[0] for _ in range(reps)])
        elbo = Trace_ELBO(num_particles=P, vectorize_particles=True, max_plate_nesting=1)
        theirs = torch.tensor([elbo.loss(net.model, net.guide, x, y) for _ in range(reps)])
    se = (ours.var() / reps + theirs.var() / reps).sqrt()
    # our weight KL uses one shared weight draw per call (not per particle): still unbiased
    assert abs(ours.mean() - theirs.mean()) < 4 * se + 1e-2


def test_bayesian_projection_errors():
    net = _clf()
    with pytest.raises(ValueError, match="match no parameter"):
        bayesian_projections(net, targets="*nothing*")
    with pytest.raises(ValueError, match="guide must be"):
        bayesian_projections(net, guide="flow")
    with pytest.raises(ValueError, match="prior_scale"):
        bayesian_projections(net, prior_scale=-1.0)
    with pytest.raises(TypeError, match="BayesianNetwork"):
        bayesian_projections(torch.nn.Linear(2, 2))
    bayesian_projections(net)
    with pytest.raises(ValueError, match="already applied"):
        bayesian_projections(net)


def test_param_store_is_not_polluted_between_networks():
    a, b = _clf(), _clf()
    x, y = _data()
    pyro.infer.Trace_ELBO().loss(a.model, a.guide, x, y)
    pyro.infer.Trace_ELBO().loss(b.model, b.guide, x, y)
    # PyroModule parameters are the modules' own tensors, never shared through the store
    assert a.head.weight is not b.head.weight
    assert not torch.equal(a.head.weight, b.head.weight)


def test_bayesian_head_vectorises_and_layernorm_is_refused():
    net = _clf()
    bayesian_projections(net, targets=("*in_proj_weight", "head.weight"))
    x, _ = _data()
    pred = Predictive(net.model, guide=net.guide, num_samples=3, parallel=True)(x)
    assert pred["head.weight"].shape[-2:] == (3, 8)
    with pytest.raises(ValueError, match="LayerNorm"):
        bayesian_projections(_clf(), targets="*norm1.weight")


def test_bayesian_projections_ignore_stale_param_store_entries():
    """A second network with the same Pyro names starts from its own values, not the store's."""
    first = _clf()
    bayesian_projections(first)
    with torch.no_grad():
        first.weight_guide()  # registers its parameters in the global store
        for p in first.weight_guide.parameters():
            p.add_(5.0)
        first.weight_guide()
    second = _clf()
    w0 = second.encoder.layers[0].self_attn.in_proj_weight.detach().clone()
    bayesian_projections(second)
    med = second.weight_guide.median()["encoder.layers.0.self_attn.in_proj_weight"]
    torch.testing.assert_close(med, w0)


def _kl_vit(attention):
    torch.manual_seed(0)
    return VisionTransformer(3, image_size=4, patch_size=2, d_model=8, nhead=2, num_layers=2,
                             dim_feedforward=8, attention=attention).double()  # fmt: skip


def test_posterior_kl_is_what_the_elbo_charges_per_example_and_once_globally():
    """loss(beta=1) - loss(beta=0) with the same draws and N = B = 1 is KL_n + KL_global: the
    ELBO's own charge, example by example, against posterior_kl's per-example and global parts."""
    x = torch.rand(5, 4, 4, dtype=torch.float64)
    y = torch.tensor([0, 1, 2, 0, 1])
    for attention in (AttentionConfig.last_layer(),
                      AttentionConfig(read="sparse_gp", layers="last")):  # fmt: skip
        net = _kl_vit(attention).eval()
        for m in net.global_latents():
            with torch.no_grad():
                m.q_mean.normal_()  # a global KL well away from 0
        local, glob = net.posterior_kl(x, batch_size=2)
        assert local.shape == (5,) and local.dtype == torch.float64
        for n in range(5):
            losses = []
            for beta in (1.0, 0.0):
                torch.manual_seed(7)
                loss = net.elbo_loss(x[n : n + 1], y[n : n + 1], beta=beta)[0]
                losses.append(float(loss.detach()))
            assert losses[0] - losses[1] == pytest.approx(float(local[n]) + glob, abs=1e-8)
        if attention.read == "sparse_gp":
            assert glob > 1.0 and float(local.abs().max()) == 0.0
            assert glob == pytest.approx(sum(float(m.kl()) for m in net.global_latents()))
        else:
            assert float(local.min()) > 0.0 and glob == 0.0
            # per-example: the same numbers whatever the chunking
            torch.testing.assert_close(net.posterior_kl(x, batch_size=5)[0], local)


def test_posterior_kl_of_a_deterministic_network_is_zero_and_checks_its_input():
    net = _kl_vit(None)
    net.train()
    local, glob = net.posterior_kl(torch.rand(3, 4, 4, dtype=torch.float64))
    assert float(local.abs().max()) == 0.0 and glob == 0.0
    assert net.training  # the mode is restored
    with pytest.raises(ValueError, match="batch_size"):
        net.posterior_kl(torch.rand(3, 4, 4, dtype=torch.float64), batch_size=0)
    with pytest.raises(ValueError):
        net.posterior_kl(torch.rand(3, 5, dtype=torch.float64))


def test_posterior_kl_counts_bayesian_weights_globally():
    net = _kl_vit(None)
    bayesian_projections(net, targets=("*out_proj.weight",))
    pyro.clear_param_store()
    local, glob = net.posterior_kl(torch.rand(3, 4, 4, dtype=torch.float64))
    assert float(local.abs().max()) == 0.0 and glob > 0.0
    x, y = torch.rand(1, 4, 4, dtype=torch.float64), torch.tensor([1])
    losses = []
    for beta in (1.0, 0.0):
        torch.manual_seed(3)
        losses.append(float(net.elbo_loss(x, y, beta=beta)[0].detach()))
    assert losses[0] - losses[1] == pytest.approx(glob, rel=1e-6)


def test_posterior_kl_of_sequence_models_reads_their_targets():
    """Seq2Seq/CausalLM with latents in every layer: per sequence, the ELBO's charge at beta 1
    vs 0 with the same draws; a later layer's KL depends on earlier draws, so ``num_samples``
    averages the estimate."""
    torch.manual_seed(0)
    src = torch.randint(3, 6, (3, 4))
    tgt = torch.tensor([[1, 3, 4, 2, 0], [1, 5, 5, 6, 2], [1, 4, 2, 0, 0]])
    for net, x, y in ((Seq2Seq(6, 7, attention=AttentionConfig("dirichlet"), **SMALL), src, tgt),
                      (CausalLM(7, attention=AttentionConfig("dirichlet"), **SMALL), tgt, None)):  # fmt: skip
        net.eval()
        local, glob = net.posterior_kl(x, y, batch_size=2)
        assert local.shape == (3,) and float(local.min()) > 0.0 and glob == 0.0
        for n in range(3):
            xn, yn = x[n : n + 1], None if y is None else y[n : n + 1]
            torch.manual_seed(5)
            want = float(net.posterior_kl(xn, yn)[0][0])
            losses = []
            for beta in (1.0, 0.0):
                torch.manual_seed(5)
                losses.append(float(net.elbo_loss(xn, yn, beta=beta)[0].detach()))
            assert losses[0] - losses[1] == pytest.approx(want, rel=1e-5)
        # the estimate averaged over draws: the mean of single draws, and less spread
        torch.manual_seed(1)
        many = net.posterior_kl(x, y, num_samples=64)[0]
        singles = torch.stack([net.posterior_kl(x, y)[0] for _ in range(64)])
        torch.testing.assert_close(many, singles.mean(0), rtol=0.02, atol=0.0)
    with pytest.raises(ValueError, match="num_samples"):
        net.posterior_kl(x, y, num_samples=0)


def test_posterior_kl_of_no_inputs_is_a_clear_error_and_zeros_are_float():
    """issue 33: posterior_kl(x[:0]) was a bare torch.cat error; a network without latents gave
    integer zeros for token inputs."""
    net = TransformerClassifier(2, vocab_size=6, d_model=8, nhead=2, num_layers=1,
                                dim_feedforward=16, attention="dirichlet")  # fmt: skip
    x = torch.randint(1, 6, (3, 4))
    with pytest.raises(ValueError, match="at least one input"):
        net.posterior_kl(x[:0])
    local, glob = net.posterior_kl(x)
    assert local.shape == (3,) and bool((local >= 0).all()) and glob >= 0
    plain = TransformerClassifier(2, vocab_size=6, d_model=8, nhead=2, num_layers=1,
                                  dim_feedforward=16)  # fmt: skip
    local, glob = plain.posterior_kl(x)
    assert local.is_floating_point() and float(local.abs().max()) == 0.0 and glob == 0.0


def test_token_embeddings_start_small_for_every_token_network():
    """Token rows start N(0, 1/E): unit scale per coordinate after the sqrt(E) multiplier, the
    scale of the positions (nn.Embedding's N(0, 1) would be sqrt(E) = 8 times larger)."""
    from bayesattn.nn.networks import CausalLM, Seq2Seq, TransformerClassifier
    from bayesattn.nn.networks.base import TOKEN_INIT_STD

    torch.manual_seed(0)
    E = 64
    nets = [TransformerClassifier(3, vocab_size=2000, d_model=E).embed,
            CausalLM(2000, d_model=E).embed, Seq2Seq(2000, 2000, d_model=E).src_embed]  # fmt: skip
    for emb in nets:
        seen = emb.tokens.weight * emb.scale
        assert abs(seen.std().item() - TOKEN_INIT_STD) < 0.01
        assert abs(seen.mean().item()) < 0.01
        assert abs(emb.pos.weight.std().item() - 1.0) < 0.05  # the positions' scale
    vec = TransformerClassifier(3, input_dim=5, d_model=E).embed
    assert vec.tokens is None and vec.proj is not None
