"""The latent-alignment emission that reads the aligned word in context
(``Seq2Seq(emission="context")``): a per-position second implementation, closed-form marginal ==
Pyro enumeration, closed gates, the uniform-prior start, masking, generation, bad input."""

from __future__ import annotations

import pyro
import pytest
import torch
import torch.nn.functional as F
from pyro.infer import TraceEnum_ELBO

from bayesattn.functional.alignment import alignment_log_posterior
from bayesattn.nn.alignment import LatentAlignment, enumerated_alignment_model
from bayesattn.nn.networks import Seq2Seq
from bayesattn.predictive import alignment_posterior
from tests.nn.test_latent_alignment import _batch  # the same padded batch

SMALL = dict(d_model=8, nhead=2, num_encoder_layers=1, dim_feedforward=16, dropout=0.0, max_len=8)


def _net(alignment: str = "latent", seed: int = 0, open_gates: bool = True, **kw) -> Seq2Seq:
    torch.manual_seed(seed)
    net = Seq2Seq(9, 11, alignment=alignment, emission="context", **{**SMALL, **kw})
    if open_gates:  # gates start closed; open them so every path of the emission is exercised
        with torch.no_grad():
            net.latent.context_gate.normal_()
            net.latent.prefix_gate.normal_()
    return net.double().eval()




def _states(net: Seq2Seq, src: torch.Tensor, tgt: torch.Tensor):
    mem, pad = net.encode(src)
    h = net.decoder(net.tgt_embed(tgt[:, :-1]))
    return h, mem, pad


def _terms(net: Seq2Seq, src: torch.Tensor, tgt: torch.Tensor):
    """The prior ``(B, T, Ts)`` and the emissions ``(B, T, Ts, V)`` from the latent module."""
    h, mem, pad = _states(net, src, tgt)
    return net.latent.log_prior(h, mem, pad), net.latent.log_emissions(h, src, mem)


def _emission_by_hand(lat: LatentAlignment, h_t, x_j, m_j, prefix: bool = True) -> torch.Tensor:
    """One position's log p(· | z_t = j), written out from the formula with torch.nn.functional
    (a second implementation of the broadcast one)."""
    u = lat.word.weight[x_j] + lat.context_gate * F.linear(
        m_j, lat.context.weight, lat.context.bias
    )
    if prefix:
        u = u + lat.prefix_gate * F.linear(h_t, lat.prefix.weight, lat.prefix.bias)
    n1 = F.layer_norm(u, (u.shape[-1],), lat.norm1.weight, lat.norm1.bias, lat.norm1.eps)
    ff = F.linear(F.relu(F.linear(n1, lat.linear1.weight, lat.linear1.bias)), lat.linear2.weight,
                  lat.linear2.bias)  # fmt: skip
    g = u + ff
    n2 = F.layer_norm(g, (g.shape[-1],), lat.norm2.weight, lat.norm2.bias, lat.norm2.eps)
    return torch.log_softmax(F.linear(n2, lat.head.weight, lat.head.bias), -1)


@pytest.mark.parametrize("uniform_prior", [False, True])
def test_emissions_and_marginal_equal_a_per_position_computation(uniform_prior: bool) -> None:
    net = _net()
    net.latent.uniform_prior = uniform_prior
    src, tgt = _batch()
    with torch.no_grad():
        h, mem, pad = _states(net, src, tgt)
        log_em = net.latent.log_emissions(h, src, mem)  # (B, T, Ts, V)
        log_prior = net.latent.log_prior(h, mem, pad)  # (B, T, Ts)
        logits = net(src, tgt)
        B, T, Ts, V = log_em.shape
        by_hand = torch.empty(B, T, Ts, V, dtype=torch.float64)
        marginal = torch.full((B, T, V), float("-inf"), dtype=torch.float64)
        for b in range(B):
            for t in range(T):
                for j in range(Ts):
                    e = _emission_by_hand(net.latent, h[b, t], src[b, j], mem[b, j],
                                          prefix=not uniform_prior)  # fmt: skip
                    by_hand[b, t, j] = e
                    if not pad[b, j]:
                        marginal[b, t] = torch.logaddexp(marginal[b, t], log_prior[b, t, j] + e)
    assert torch.allclose(log_em, by_hand, atol=1e-10)
    assert torch.allclose(logits, marginal, atol=1e-10)
    if uniform_prior:  # IBM Model 1: one output distribution per source word, at every t
        assert torch.allclose(
            log_prior[1], torch.full_like(log_prior[1], -torch.log(torch.tensor(5.0)))
        )
        assert torch.equal(log_em, log_em[:, :1].expand_as(log_em))
    else:
        assert not torch.allclose(log_em[:, 0], log_em[:, 1])  # the prefix enters


def test_network_likelihood_equals_trace_enum_elbo() -> None:
    net = _net()
    src, tgt = _batch()
    with torch.no_grad():
        log_prior, log_em = _terms(net, src, tgt)
        logits = net(src, tgt)
    y, mask = tgt[:, 1:], tgt[:, 1:] != net.pad_id
    closed = -net.likelihood(logits, mask, 1).log_prob(y).sum()
    pyro.clear_param_store()
    enum = TraceEnum_ELBO(max_plate_nesting=2).loss(
        enumerated_alignment_model, lambda *a, **k: None, log_prior, log_em, y, mask
    )
    assert torch.allclose(torch.logsumexp(logits, -1), torch.zeros((), dtype=torch.float64))
    assert enum == pytest.approx(float(closed), rel=1e-9)


def test_closed_gates_start_as_a_one_word_emission_and_can_open() -> None:
    """At initialisation neither the encoder state nor the prefix changes the emission; both
    gates get a gradient, so training can open them."""
    net = _net(open_gates=False).train()
    src, tgt = _batch()
    h, mem, _ = _states(net, src, tgt)
    log_em = net.latent.log_emissions(h, src, mem)
    other = net.latent.log_emissions(torch.randn_like(h), src, torch.randn_like(mem))
    assert torch.equal(log_em, other)
    assert torch.allclose(log_em, log_em[:, :1].expand_as(log_em), atol=1e-12)
    loss, _ = net.elbo_loss(src, tgt)
    loss.backward()
    assert net.latent.context_gate.grad.abs().sum() > 0
    assert net.latent.prefix_gate.grad.abs().sum() > 0


def test_padded_source_positions_do_not_count() -> None:
    net = _net()
    src, tgt = _batch()
    with torch.no_grad():
        h, mem, pad = _states(net, src, tgt)
        junk = mem.clone()
        junk[pad] = 1e3 * torch.randn_like(junk[pad])  # whatever sits at the padded positions
        a = net.latent(h, mem, src, pad)
        b = net.latent(h, junk, src, pad)
        ap = alignment_posterior(net, src, tgt)
    assert torch.allclose(a, b, atol=1e-10)
    assert (ap.prior[0, :, -2:] == 0).all() and (ap.posterior[0, :, -2:] == 0).all()


def test_alignment_posterior_is_bayes_rule_on_the_model() -> None:
    net = _net()
    src, tgt = _batch()
    with torch.no_grad():
        log_prior, log_em = _terms(net, src, tgt)
        ap = alignment_posterior(net, src, tgt)
    y = tgt[:, 1:]
    log_lik = log_em.gather(-1, y[:, :, None, None].expand(*log_em.shape[:-1], 1))[..., 0]
    expected = alignment_log_posterior(log_prior, log_lik).exp()  # (B, T, Ts)
    rows = ap.tgt_mask
    assert torch.allclose(ap.posterior.double()[rows], expected[rows], atol=1e-6)
    assert torch.allclose(ap.prior.double()[rows], log_prior.exp()[rows], atol=1e-6)


def test_generation_samples_and_variational_decoder() -> None:
    net = _net()
    src, tgt = _batch()
    gen = net.generate(src, max_len=4, num_samples=2)
    assert gen.tokens.shape[0] == 3 and gen.tokens.shape[1] <= 4
    assert torch.allclose(gen.probs.sum(-1), torch.ones_like(gen.probs[..., 0]))
    with torch.no_grad():
        lp, ll, logits = net.alignment_terms(src, tgt, num_samples=2)
    assert lp.shape == ll.shape == (2, 3, 5, 5) and logits.shape == (2, 3, 5, 11)
    # the variational decoder with the same emission: λ = 1 is the exact marginal likelihood
    vnet = _net("variational", marginal_weight=1.0)
    with torch.no_grad():
        loss, vlogits = vnet.elbo_loss(src, tgt)
    mask = tgt[:, 1:] != vnet.pad_id
    nll = -vnet.likelihood(vlogits, mask, 1).log_prob(tgt[:, 1:]).sum()
    assert float(loss) == pytest.approx(float(nll), rel=1e-9)


def test_the_default_emission_is_context_for_latent_decoders_and_none_for_soft() -> None:
    """``emission=None`` (the default): the context emission for a latent or variational
    decoder, no emission module for soft attention (``"word"`` stays selectable)."""
    for alignment in ("latent", "variational"):
        net = Seq2Seq(9, 11, alignment=alignment, **SMALL)
        assert net.latent is not None and net.latent.emission == "context"
        assert net.latent.context_gate is not None and net.latent.prefix_gate is not None
        word = Seq2Seq(9, 11, alignment=alignment, emission="word", **SMALL)
        assert word.latent is not None and word.latent.emission == "word"
        assert word.latent.context_gate is None
    for emission in (None, "word"):
        soft = Seq2Seq(9, 11, emission=emission, **SMALL)  # type: ignore[arg-type]
        assert soft.latent is None and soft.head is not None
    # the module built on its own has the same default as the decoders that build it
    assert LatentAlignment(8, 5, 6, 16).emission == "context"
    assert LatentAlignment(8, 5, 6, 16, emission="word").context_gate is None


def test_a_state_dict_of_the_other_emission_names_the_emission_to_build() -> None:
    word = Seq2Seq(9, 11, alignment="latent", emission="word", **SMALL)
    context = Seq2Seq(9, 11, alignment="latent", **SMALL)
    with pytest.raises(RuntimeError, match="holds a 'word' emission but the model was built "
                                           "with emission='context'; build it with "
                                           "emission='word'"):  # fmt: skip
        context.load_state_dict(word.state_dict())
    with pytest.raises(RuntimeError, match="holds a 'context' emission .* emission='context'"):
        word.load_state_dict(context.state_dict(), strict=False)  # refused even when not strict
    # the same emission loads; a partial state without the latent layer is not checked
    Seq2Seq(9, 11, alignment="latent", **SMALL).load_state_dict(context.state_dict())
    enc = {k: v for k, v in word.state_dict().items() if k.startswith("encoder.")}
    context.load_state_dict(enc, strict=False)


def test_bad_input() -> None:
    with pytest.raises(
        ValueError, match=r"emission must be None or one of \('word', 'context'\); got 'pair'"
    ):
        Seq2Seq(9, 11, alignment="latent", emission="pair", **SMALL)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="needs alignment='latent' or 'variational', got "
                                         "alignment='soft'"):  # fmt: skip
        Seq2Seq(9, 11, emission="context", **SMALL)
    with pytest.raises(ValueError, match="emission must be one of"):
        LatentAlignment(8, 5, 6, 16, emission="neighbour")  # type: ignore[arg-type]
    net = _net()
    src, tgt = _batch()
    h, mem, _ = _states(net, src, tgt)
    with pytest.raises(ValueError, match="pass memory"):
        net.latent.log_emissions(h, src)
    with pytest.raises(ValueError, match=r"memory \(…, B, Ts, E\) and src \(B, Ts\) must agree"):
        net.latent.log_emissions(h, src, mem[:, :-1])
