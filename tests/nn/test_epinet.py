"""The epinet read-out: its logits against a hand computation, the fixed prior, the global index
site, and a small task where its spread is larger off the training features than on them."""

import pyro
import pytest
import torch

from bayesattn.nn.blocks import AttentionConfig
from bayesattn.nn.epinet import EpinetReadout
from bayesattn.nn.modes import attention_mode, collect_kl, global_values
from bayesattn.nn.networks import VisionTransformer


def _by_hand(head: EpinetReadout, h: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """W h + b + (g_eta(h) + alpha g_P(h))^T z, written out with the modules' weights."""
    C, D = head.num_classes, head.index_dim
    w0, b0, w1, b1 = (getattr(head, f"prior_{i}") for i in range(4))
    prior = (torch.relu(h @ w0.T + b0) @ w1.T + b1).reshape(*h.shape[:-1], C, D)
    l0, l1 = head.learned[0], head.learned[2]
    learned = (torch.relu(h @ l0.weight.T + l0.bias) @ l1.weight.T + l1.bias).reshape(
        *h.shape[:-1], C, D
    )
    g = learned + head.prior_scale * head.unit * prior
    return h @ head.linear.weight.T + head.linear.bias + torch.einsum("...cd,d->...c", g, z)


def test_logits_against_a_hand_computation_and_the_shapes():
    torch.manual_seed(0)
    head = EpinetReadout(6, 3, index_dim=4, hidden=5, prior_scale=0.7)
    h = torch.randn(5, 6)
    z = torch.randn(4)
    with attention_mode("guide"), global_values({head.site_name: z}):
        got = head(h)
    torch.testing.assert_close(got, _by_hand(head, h, z))
    with attention_mode("mean"):  # z = 0: the linear head
        torch.testing.assert_close(head(h), head.linear(h))
    with attention_mode("guide"), pyro.poutine.block():
        assert head(h, num_samples=7).shape == (7, 5, 3)
        assert head(h.expand(7, 5, 6), leading_samples=7).shape == (7, 5, 3)
        zs = torch.randn(7, 4)
        with global_values({head.site_name: zs}):
            many = head(h, num_samples=7)
    for s in range(7):
        torch.testing.assert_close(many[s], _by_hand(head, h, zs[s]))
    assert float(head.kl()) == 0.0
    with pytest.raises(ValueError, match="h must be"):
        head(torch.randn(2, 5))
    with pytest.raises(ValueError, match="index_dim"):
        EpinetReadout(6, 3, index_dim=0)


def test_the_prior_is_fixed_and_the_index_does_not_reshape_the_features():
    torch.manual_seed(1)
    head = EpinetReadout(4, 2)
    prior = [getattr(head, f"prior_{i}").clone() for i in range(4)]
    assert all(not p.requires_grad for p in prior)
    assert {n for n, _ in head.named_parameters()} == {
        "linear.weight", "linear.bias", "learned.0.weight", "learned.0.bias",
        "learned.2.weight", "learned.2.bias",
    }  # fmt: skip
    h = torch.randn(8, 4, requires_grad=True)
    with attention_mode("guide"), global_values({head.site_name: torch.randn(head.index_dim)}):
        head(h).sum().backward()
    # only the linear head's path reaches h: d/dh sum(W h + b) = column sums of W
    torch.testing.assert_close(h.grad, head.linear.weight.sum(0).expand(8, 4))
    for i, p in enumerate(prior):
        assert torch.equal(getattr(head, f"prior_{i}"), p)


def test_the_index_is_one_global_site_outside_the_data_plate():
    cfg = AttentionConfig(readout="epinet")
    net = VisionTransformer(3, image_size=4, patch_size=2, d_model=8, nhead=2, num_layers=1,
                            attention=cfg)  # fmt: skip
    x, y = torch.randn(5, 4, 4), torch.tensor([0, 1, 2, 0, 1])
    with net.pyro_context:
        names = [m.site_name for m in net.global_latents()]
    assert names == ["head.index"]
    tr = pyro.poutine.trace(net.model).get_trace(x, y)
    site = tr.nodes["head.index"]
    assert site["value"].shape == (8,) and not site["cond_indep_stack"]
    gtr = pyro.poutine.trace(net.guide).get_trace(x, y)
    assert "head.index" in gtr.nodes


def test_epinet_spread_is_larger_off_the_training_features():
    """Trained on features near the origin (the loss averaged over indices): the spread of the
    logits over z, ||g_eta + alpha g_P||, shrinks there and stays large far away."""
    torch.manual_seed(0)
    head = EpinetReadout(2, 2, index_dim=4, hidden=32, prior_scale=1.0)
    x = torch.randn(256, 2) * 0.7
    y = (x[:, 0] > 0).long()
    opt = torch.optim.Adam(head.parameters(), lr=0.01)
    head.train()
    far = torch.randn(256, 2) * 0.7 + 5.0
    spread = lambda h: head.index_matrix(h).square().sum((-1, -2)).mean()  # noqa: E731
    with torch.no_grad():
        head._init_from(x)
        on0 = float(spread(x))
    for _ in range(300):
        opt.zero_grad()
        with attention_mode("elbo"), collect_kl():
            logits = head(x, num_samples=8)  # (8, 256, 2)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 2), y.repeat(8))
        loss.backward()
        opt.step()
    with torch.no_grad():
        on, off = float(spread(x)), float(spread(far))
        with attention_mode("mean"):
            acc = (head(x).argmax(-1) == y).float().mean()
    assert on < 0.3 * on0  # the data cancel the prior's index dependence where they are
    assert off > 5 * on
    assert float(acc) > 0.9
