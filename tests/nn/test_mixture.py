"""The rank-1 mixture posterior over a trunk (bayesattn.nn.mixture): one vectorised pass equals
K separate networks, the ELBO's scale, the KL bound through the module, stratified draws, point
masses, a tiny training run and bad inputs."""

import contextlib
import copy
import math
import warnings

import pyro
import pytest
import torch

from bayesattn.functional.mixture import mixture_kl_mc, rank1_weight
from bayesattn.nn.mixture import Rank1Mixture, rank1_mixture
from bayesattn.nn.modes import attention_mode, collect_kl, global_values
from bayesattn.nn.networks import TransformerClassifier, VisionTransformer
from bayesattn.uncertainty import predict


def _net(K: int = 3, init_std: float | None = 0.05, seed: int = 0, pooling: str = "cls"):
    torch.manual_seed(seed)
    net = VisionTransformer(
        4, image_size=4, patch_size=2, d_model=8, nhead=2, num_layers=2, dim_feedforward=16,
        dropout=0.0, pooling=pooling,
    )  # fmt: skip
    mix = rank1_mixture(net, K, prior_std=0.5, init_spread=0.5, init_std=init_std)
    return net.eval(), mix


def _data(B: int = 6, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, 4, 4, generator=g), torch.randint(0, 4, (B,), generator=g)


def _reference_logits(net: VisionTransformer, mix: Rank1Mixture, theta: torch.Tensor):
    """A plain network (no mixture) whose weights are set to each draw's factored weights, one
    Python-loop pass per draw: ``(S, B, C)``."""
    plain = copy.deepcopy(net)
    plain.detach_trunk_mixture()
    x, _ = _data()
    out = []
    for t in theta:
        with torch.no_grad():
            for path, pname, O, I, off in mix.slots:
                W = net.get_submodule(path)._parameters[pname]
                w = rank1_weight(W, t[off : off + I], t[off + I : off + I + O])
                getattr(plain.get_submodule(path), pname).copy_(w)
        out.append(plain(x))
    return torch.stack(out)


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_one_pass_equals_k_separate_networks(pooling):
    net, mix = _net(K=3, pooling=pooling)
    x, _ = _data()
    theta = mix.posterior().sample((6,))  # (6, D): two stratified draws of each component
    with torch.no_grad(), attention_mode("guide"), global_values({mix.site_name: theta}):
        with net.pyro_context:
            packed = net.forward_logits(x, None, 6)  # (6, B, C), one pass
    torch.testing.assert_close(packed, _reference_logits(net, mix, theta), atol=1e-5, rtol=0)


def test_elbo_pass_evaluates_every_component_in_stratified_order():
    net, mix = _net(K=3)
    x, _ = _data()
    with net.pyro_context, collect_kl() as col:
        logits = net.forward_logits(x, None, 2)  # two particles
    assert logits.shape == (6, 6, 4)  # K·P draws in one pass
    theta = col.global_values[mix.site_name]  # (6, D)
    std = mix.std
    assert std is not None
    z = ((theta[:, None] - mix.mean[None]) / std).pow(2).sum(-1)  # (6, K)
    assert z.argmin(-1).tolist() == [0, 1, 2, 0, 1, 2]  # draw i is component i % K
    assert float(col.global_total().detach()) == pytest.approx(float(mix.kl().detach()))


def test_loss_averages_components_and_charges_the_kl_once():
    net, mix = _net(K=3)
    x, y = _data()
    N, B = 600, x.shape[0]
    loss, logits = net.elbo_loss(x, y, num_data=N)  # one particle: K = 3 draws
    assert logits.shape == (3, B, 4)
    ll = torch.log_softmax(logits, -1).gather(-1, y.expand(3, B)[..., None])[..., 0]  # (K, B)
    hand = -(N / B) * ll.mean(0).sum() + mix.kl()  # mean over components, KL unscaled
    torch.testing.assert_close(loss, hand)
    summed = -(N / B) * ll.sum() + mix.kl()
    assert not torch.isclose(loss, summed)


def test_point_masses_draw_each_component_identically_and_have_no_kl():
    net, mix = _net(K=2, init_std=None)
    assert mix.std is None and float(mix.kl()) == 0.0
    theta = mix.posterior().sample((6,))
    torch.testing.assert_close(theta[0::2], mix.mean[0].expand(3, -1).detach())
    torch.testing.assert_close(theta[1::2], mix.mean[1].expand(3, -1).detach())
    x, _ = _data()
    r = predict(net, x, 6)
    torch.testing.assert_close(r.probs[0::2], r.probs[0].expand(3, -1, -1))
    torch.testing.assert_close(r.probs[1::2], r.probs[1].expand(3, -1, -1))
    assert not torch.allclose(r.probs[0], r.probs[1])
    assert net.posterior_kl(x)[1] == 0.0


def test_gaussian_draws_spread_within_a_component():
    net, mix = _net(K=2)
    x, _ = _data()
    r = predict(net, x, 4)
    assert not torch.allclose(r.probs[0], r.probs[2])  # same component, different draws


def test_posterior_kl_is_the_upper_bound_and_brackets_monte_carlo():
    net, mix = _net(K=3)
    with torch.no_grad():
        mix.mean.add_(0.3 * torch.randn_like(mix.mean))
        mix.raw_std.fill_(math.log(math.expm1(0.2)))
    x, _ = _data()
    local, global_ = net.posterior_kl(x)
    assert torch.equal(local, torch.zeros(x.shape[0]))
    upper = float(mix.kl().detach())
    assert global_ == pytest.approx(upper, rel=1e-6)
    std = mix.std
    assert std is not None
    est, se = mixture_kl_mc(mix.mean.detach().double(), std.detach().double(), 1.0, 0.5,
                            num_samples=3000, generator=torch.Generator().manual_seed(0))  # fmt: skip
    assert upper - math.log(3) - 4 * se <= est <= upper + 4 * se


def test_mean_mode_is_the_average_of_the_component_means_predictive():
    net, mix = _net(K=3)
    x, _ = _data()
    with torch.no_grad():
        ref = _reference_logits(net, mix, mix.mean.detach()).softmax(-1).mean(0)  # (B, C)
        out = net(x).softmax(-1)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)


def test_predict_needs_a_multiple_of_k_draws():
    net, _ = _net(K=4)
    x, _ = _data()
    with pytest.raises(ValueError, match=r"num_samples=6 must be a multiple of the mixture's K=4"):
        predict(net, x, 6)
    assert predict(net, x, 1).probs.shape == (1, 6, 4)  # one component at random
    assert predict(net, x, 8).probs.shape == (8, 6, 4)


def test_svi_model_and_guide_run():
    net, _ = _net(K=2)
    x, y = _data()
    pyro.clear_param_store()
    loss = pyro.infer.Trace_ELBO().differentiable_loss(net.model, net.guide, x, y, 60)
    assert torch.isfinite(loss)


def test_tiny_training_run_learns():
    from bayesattn.training import fit

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    centres = 2.0 * torch.randn(3, 4, 4, generator=g)
    y = torch.randint(0, 3, (96,), generator=g)
    x = centres[y] + 0.5 * torch.randn(96, 4, 4, generator=g)
    net = VisionTransformer(3, image_size=4, patch_size=2, d_model=8, nhead=2, num_layers=1,
                            dim_feedforward=16, dropout=0.0)  # fmt: skip
    mix = rank1_mixture(net, 2, prior_std=1.0, init_std=0.1)
    mean0 = mix.mean.detach().clone()
    pyro.clear_param_store()
    fit(net, (x, y), method="hybrid", epochs=15, batch_size=32, lr=1e-2, seed=0, progress=False)
    acc = float((predict(net.eval(), x, 4).mean_probs.argmax(-1) == y).float().mean())
    assert acc > 0.9
    assert not torch.allclose(mix.mean, mean0)


def test_bad_inputs():
    net, _ = _net()
    with pytest.raises(ValueError, match="already applied"):
        rank1_mixture(net)
    with pytest.raises(TypeError, match="TransformerClassifier"):
        rank1_mixture(torch.nn.Linear(2, 2))  # type: ignore[arg-type]
    plain = TransformerClassifier(3, input_dim=2, d_model=8, nhead=2)
    with pytest.raises(ValueError, match="num_components"):
        rank1_mixture(plain, 0)
    with pytest.raises(ValueError, match="prior_std"):
        rank1_mixture(plain, 2, prior_std=0.0)
    with pytest.raises(ValueError, match="init must be"):
        rank1_mixture(plain, 2, init="uniform")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="init_spread is a probability"):
        rank1_mixture(plain, 2, init="sign", init_spread=1.5)
    with pytest.raises(ValueError, match="init_std"):
        rank1_mixture(plain, 2, init_std=-1.0)
    _, pm = _net(K=2, init_std=None)
    with pytest.raises(ValueError, match="no density"):
        pm.posterior().log_prob(pm.mean[0])


def _plain_with(net, mix, t):
    """A copy of ``net`` without the mixture, its weights set to factors ``t`` ``(D,)``."""
    plain = copy.deepcopy(net)
    plain.detach_trunk_mixture()
    with torch.no_grad():
        for path, pname, O, I, off in mix.slots:
            W = net.get_submodule(path)._parameters[pname]
            w = rank1_weight(W, t[off : off + I], t[off + I : off + I + O])
            getattr(plain.get_submodule(path), pname).copy_(w)
    return plain


def test_predict_keeps_each_components_attention_in_stratified_order():
    net, mix = _net(K=3, init_std=None)  # point masses: draw i is exactly component i % K
    x, _ = _data()
    r = predict(net, x, 6, keep_attention=True)
    assert r.components is not None and r.components.tolist() == [0, 1, 2, 0, 1, 2]
    name = "encoder.layers.0.self_attn"
    w = r.attention[name].samples  # (6, B, H, T, T)
    assert w.shape == (6, 6, 2, 5, 5)
    maps = []
    for k in range(3):
        ref = predict(_plain_with(net, mix, mix.mean[k].detach()), x, 1, keep_attention=True)
        maps.append(ref.attention[name].samples[0])
        torch.testing.assert_close(w[k], maps[k], atol=1e-6, rtol=0)
        torch.testing.assert_close(w[k + 3], maps[k], atol=1e-6, rtol=0)
    assert not torch.allclose(maps[0], maps[1], atol=1e-4)  # the modes differ
    # in "mean" mode the kept map averages the K component means' maps
    rm = predict(net, x, 1, keep_attention=True, mode="mean")
    torch.testing.assert_close(rm.attention[name].samples[0], torch.stack(maps).mean(0),
                               atol=1e-6, rtol=0)  # fmt: skip
    assert rm.components is None


def test_the_swap_restores_parameters_and_leaves_pyro_alone():
    net, mix = _net(K=2)
    before = list(net.named_parameters())
    x, y = _data()
    pyro.clear_param_store()
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # e.g. pyro.module on a swapped tensor
        net.elbo_loss(x, y, num_data=60)[0].backward()
        predict(net, x, 2)
    after = list(net.named_parameters())
    assert [n for n, _ in after] == [n for n, _ in before]
    assert all(p is q for (_, p), (_, q) in zip(after, before, strict=True))
    assert all(v.is_leaf for v in pyro.get_param_store().values())
    assert not list(net.buffers()) or all(
        "weight" not in n for n, _ in net.named_buffers()
    )



def test_linear_with_one_weight_per_sample_is_a_batched_gemm():
    from bayesattn.nn.attention import linear

    g = torch.Generator().manual_seed(0)
    x, W, b = torch.randn(3, 4, 5, 6, generator=g), torch.randn(3, 7, 6, generator=g), torch.randn(7)
    ref = torch.stack([torch.nn.functional.linear(x[s], W[s], b) for s in range(3)])
    torch.testing.assert_close(linear(x, W, b), ref)


def test_fused_attention_with_sample_dims_equals_per_sample():
    from bayesattn.nn.attention import BayesianMultiheadAttention

    torch.manual_seed(0)
    mha = BayesianMultiheadAttention(8, 2, batch_first=True).eval()
    x = torch.randn(3, 4, 5, 8)  # (S, B, T, E)
    pad = torch.zeros(4, 5, dtype=torch.bool)
    pad[1, 3:] = True
    with torch.no_grad():
        out = mha(x, x, x, key_padding_mask=pad, need_weights=False)[0]
        ref = torch.stack([mha(x[s], x[s], x[s], key_padding_mask=pad, need_weights=False)[0]
                           for s in range(3)])  # fmt: skip
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=0)


class _ScaledTrunk(torch.nn.Module):
    """A user's trunk hook (the TrunkMixture protocol, not a Rank1Mixture): one component that
    halves every linear1 weight for the pass and doubles the logits."""

    num_components = 1

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    @contextlib.contextmanager
    def trunk(self, net, num_samples):
        from bayesattn.nn.mixture import swapped_parameters

        self.calls += 1
        halved = {(l.linear1, "weight"): l.linear1.weight * 0.5 for l in net.encoder.layers}
        with swapped_parameters(halved):
            yield num_samples

    def read_logits(self, logits, num_samples):
        return 2 * logits

    def kl(self):
        return torch.zeros(())


def test_the_trunk_hook_is_any_module_with_the_protocol():
    net, _ = _net(K=2)
    net.detach_trunk_mixture()
    assert net.trunk_mixture is None
    x, _ = _data()
    plain = copy.deepcopy(net)
    with torch.no_grad():  # the reference: the halved weights written in, the logits doubled
        base = net(x)
        for layer in plain.encoder.layers:
            layer.linear1.weight.mul_(0.5)
        want = 2 * plain(x)
    hook = _ScaledTrunk()
    net.attach_trunk_mixture(hook)
    with torch.no_grad():
        got = net(x)
    assert hook.calls == 1 and torch.allclose(got, want, atol=1e-6)
    assert not torch.allclose(got, base, atol=1e-3)
    assert net.first_stochastic_layer() == 0  # samples start at layer 0 with a trunk hook
    with pytest.raises(ValueError, match="already has a trunk mixture"):
        net.attach_trunk_mixture(_ScaledTrunk())
    with pytest.raises(TypeError, match="hook must be an nn.Module"):
        plain.attach_trunk_mixture(object())  # type: ignore[arg-type]
    assert net.detach_trunk_mixture() is hook and net.trunk_mixture is None
    with torch.no_grad():
        assert torch.equal(net(x), base)  # the weights were swapped back
    assert net.first_stochastic_layer() == len(net.encoder.layers)  # "mean" mode: none random


def test_the_mixture_is_saved_under_the_same_keys():
    net, mix = _net(K=2)
    keys = [k for k in net.state_dict() if k.startswith("trunk_mixture.")]
    assert keys == ["trunk_mixture.mean", "trunk_mixture.raw_std"]
    assert net.trunk_mixture is mix
