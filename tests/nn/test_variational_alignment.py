"""The variational latent-alignment Seq2Seq: the exact ELBO == Pyro's TraceEnum_ELBO with an
enumerated guide, the bound and its equality at the exact posterior, the inference network's
masking and its view of the whole target, training, generation, validation."""

from __future__ import annotations

import pyro
import pytest
import torch
from pyro.infer import TraceEnum_ELBO

from bayesattn.functional.alignment import (
    alignment_elbo,
    alignment_log_posterior,
    mixture_log_probs,
)
from bayesattn.nn.alignment import enumerated_alignment_guide, enumerated_alignment_model
from bayesattn.nn.alignment_inference import AlignmentInference
from bayesattn.nn.networks import Seq2Seq
from bayesattn.predictive import alignment_posterior

SMALL = dict(d_model=8, nhead=2, num_encoder_layers=1, num_decoder_layers=1, dim_feedforward=16,
             dropout=0.0, max_len=8)  # fmt: skip


def _net(alignment: str = "variational", seed: int = 0, **kw) -> Seq2Seq:
    torch.manual_seed(seed)
    # the one-word emission (the context emission has its own tests: test_context_emission)
    kw.setdefault("emission", "word")
    return Seq2Seq(9, 11, alignment=alignment, **{**SMALL, **kw}).eval()


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    src = torch.randint(3, 9, (3, 5), generator=g)
    src[0, -2:] = 0  # padding
    tgt = torch.randint(3, 11, (3, 6), generator=g)
    tgt[:, 0], tgt[:, -1] = 1, 2  # BOS … EOS
    tgt[1, -2:] = torch.tensor([2, 0])  # an early EOS, then padding
    return src, tgt


def _random_terms(seed: int = 0, B: int = 3, T: int = 4, Ts: int = 5, V: int = 6):
    g = torch.Generator().manual_seed(seed)
    f64 = dict(generator=g, dtype=torch.float64)
    log_prior = torch.log_softmax(torch.randn(B, T, Ts, **f64), -1)
    log_q = torch.log_softmax(2 * torch.randn(B, T, Ts, **f64), -1)
    log_em = torch.log_softmax(torch.randn(B, T, Ts, V, **f64), -1)
    y = torch.randint(0, V, (B, T), generator=g)
    return log_prior, log_q, log_em, y


def _lik(log_em: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return log_em.gather(-1, y[:, :, None, None].expand(*log_em.shape[:-1], 1)).squeeze(-1)


def _guided_loss(log_prior, log_q, log_em, y, mask) -> float:
    pyro.clear_param_store()
    elbo = TraceEnum_ELBO(max_plate_nesting=2)
    model = lambda *a: enumerated_alignment_model(log_prior, *a, guided=True)  # noqa: E731
    guide = lambda *a: enumerated_alignment_guide(log_q, *a)  # noqa: E731
    return float(elbo.loss(model, guide, log_em, y, mask))


def test_closed_form_elbo_equals_trace_enum_elbo_with_an_enumerated_guide() -> None:
    log_prior, log_q, log_em, y = _random_terms()
    log_q[0, 1, -2:] = float("-inf")  # q may put no mass on some positions
    log_q[0, 1] = torch.log_softmax(log_q[0, 1], -1)
    mask = torch.ones_like(y, dtype=torch.bool)
    mask[0, -1] = mask[2, -2:] = False
    closed = alignment_elbo(log_q, log_prior, _lik(log_em, y))  # (B, T)
    assert _guided_loss(log_prior, log_q, log_em, y, mask) == pytest.approx(
        -float(closed[mask].sum()), rel=1e-10
    )


def test_elbo_is_below_the_marginal_and_equal_at_the_exact_posterior() -> None:
    log_prior, log_q, log_em, y = _random_terms(seed=3)
    lik = _lik(log_em, y)
    marginal = mixture_log_probs(log_prior, log_em).gather(-1, y[..., None]).squeeze(-1)
    gap = marginal - alignment_elbo(log_q, log_prior, lik)
    assert (gap > 1e-6).all()  # a random q is not the posterior
    exact = alignment_log_posterior(log_prior, lik)
    assert torch.allclose(alignment_elbo(exact, log_prior, lik), marginal, atol=1e-12)
    # the gap is KL(q || exact posterior)
    kl = (log_q.exp() * (log_q - exact)).sum(-1)
    assert torch.allclose(gap, kl, atol=1e-12)


def test_alignment_elbo_rejects_mismatched_shapes() -> None:
    log_prior, log_q, log_em, y = _random_terms()
    with pytest.raises(ValueError, match="log_q, log_prior and log_lik"):
        alignment_elbo(log_q[:, :-1], log_prior, _lik(log_em, y))
    with pytest.raises(ValueError, match="log_q"):
        enumerated_alignment_guide(log_q[:, :-1], log_em, y)


def test_network_elbo_loss_is_the_closed_form_and_pyro_number() -> None:
    net = _net()
    src, tgt = _batch()
    y, mask = tgt[:, 1:], tgt[:, 1:] != net.pad_id
    with torch.no_grad():
        loss, logits = net.elbo_loss(src, tgt)
        lp, ll, logits2 = net.alignment_terms(src, tgt)
        log_q = net.inference_log_posterior(src, tgt)
        mem, pad = net.encode(src)
        h = net.decoder(net.tgt_embed(tgt[:, :-1]))
        log_em = net.latent.log_emissions(h, src)
    assert torch.allclose(logits, logits2, atol=1e-6)
    pyro_loss = _guided_loss(lp.double(), log_q.double(), log_em.double(), y, mask)
    assert float(loss) == pytest.approx(pyro_loss, rel=1e-5)
    nll = -float(net.likelihood(logits, mask, 1).log_prob(y).sum())
    assert float(loss) > nll  # the ELBO bounds the marginal likelihood the logits give
    # marginal_weight = 1: the exact marginal likelihood, as alignment="latent" trains
    net.marginal_weight = 1.0
    with torch.no_grad():
        assert float(net.elbo_loss(src, tgt)[0]) == pytest.approx(nll, rel=1e-5)
        net.marginal_weight = 0.25
        mixed = float(net.elbo_loss(src, tgt)[0])
    assert mixed == pytest.approx(0.75 * float(loss) + 0.25 * nll, rel=1e-5)
    # particles travel as a leading sample dim; a deterministic network's particles agree
    net.marginal_weight = 0.0
    with torch.no_grad():
        loss2, logits2 = net.elbo_loss(src, tgt, num_particles=2)
    assert logits2.shape == (2, *logits.shape)
    assert float(loss2) == pytest.approx(float(loss), rel=1e-5)


def test_inference_network_masks_padding_and_reads_the_future() -> None:
    net = _net()
    src, tgt = _batch()
    with torch.no_grad():
        log_q = net.inference_log_posterior(src, tgt, num_samples=2)
        assert log_q.shape == (2, 3, 5, 5)
        assert (log_q[:, 0, :, -2:] == float("-inf")).all()  # padded source positions
        assert torch.allclose(log_q.exp().sum(-1), torch.ones(2, 3, 5), atol=1e-5)
        later = tgt.clone()
        later[:, 3] = torch.where(tgt[:, 3] == 5, 6, 5)  # change the word predicted at t = 2
        q2 = net.inference_log_posterior(src, later)
        lp1, _, _ = net.alignment_terms(src, tgt)
        lp2, _, _ = net.alignment_terms(src, later)
    assert not torch.allclose(log_q[0, :, 0], q2[:, 0])  # q at t = 0 sees the word at t = 2
    assert torch.allclose(lp1[:, :3], lp2[:, :3])  # the prior of t <= 2 cannot see it


def test_alignment_posterior_reads_the_inference_network() -> None:
    net = _net()
    src, tgt = _batch()
    ap = alignment_posterior(net, src, tgt, posterior="inference")
    exact = alignment_posterior(net, src, tgt)
    with torch.no_grad():
        log_q = net.inference_log_posterior(src, tgt)
    assert torch.allclose(ap.posterior, log_q.exp())
    assert torch.allclose(ap.prior, exact.prior)
    assert not torch.allclose(ap.posterior, exact.posterior)
    assert ap.kl().shape == (3, 5)


def test_variational_decoder_trains_and_generates() -> None:
    net = _net().train()
    src, tgt = _batch()
    q_before = net.inference.q_proj.weight.detach().clone()
    pri_before = net.latent.q_proj.weight.detach().clone()
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    losses = []
    for _ in range(30):
        opt.zero_grad()
        loss, _ = net.elbo_loss(src, tgt)
        loss.backward()
        assert all(torch.isfinite(p.grad).all() for p in net.parameters() if p.grad is not None)
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < 0.5 * losses[0]
    assert not torch.equal(net.inference.q_proj.weight, q_before)  # the ELBO trains q ...
    assert not torch.equal(net.latent.q_proj.weight, pri_before)  # ... and the prior (its KL)
    gen = net.eval().generate(src, max_len=4)
    assert gen.tokens.shape[0] == 3
    assert torch.allclose(gen.probs.sum(-1), torch.ones_like(gen.probs[..., 0]), atol=1e-5)


def test_bad_input_errors() -> None:
    with pytest.raises(ValueError, match="marginal_weight"):
        Seq2Seq(9, 11, alignment="latent", marginal_weight=0.5, **SMALL)
    with pytest.raises(ValueError, match="marginal_weight"):
        Seq2Seq(9, 11, alignment="variational", marginal_weight=1.5, **SMALL)
    with pytest.raises(ValueError, match="alignment must be one of"):
        Seq2Seq(9, 11, alignment="posterior", **SMALL)  # type: ignore[arg-type]
    src, tgt = _batch()
    latent = _net("latent")
    with pytest.raises(ValueError, match="posterior='inference' needs"):
        alignment_posterior(latent, src, tgt, posterior="inference")
    with pytest.raises(ValueError, match="posterior must be one of"):
        alignment_posterior(_net(), src, tgt, posterior="q")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="inference network"):
        latent.inference_log_posterior(src, tgt)
    with pytest.raises(ValueError, match="needs targets"):
        _net().elbo_loss(src, None)


def test_inference_network_validates_its_inputs() -> None:
    inf = AlignmentInference(8, 2, 11, max_len=4, dim_feedforward=16)
    mem = torch.zeros(2, 3, 8)
    assert inf(torch.ones(2, 4, dtype=torch.long), mem).shape == (2, 4, 3)
    with pytest.raises(ValueError, match="max_len 4"):
        inf(torch.ones(2, 5, dtype=torch.long), mem)
    with pytest.raises(ValueError, match="same batch size"):
        inf(torch.ones(3, 4, dtype=torch.long), mem)
    with pytest.raises(ValueError, match="vocab_size"):
        AlignmentInference(8, 2, 0, max_len=4, dim_feedforward=16)
