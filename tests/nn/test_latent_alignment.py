"""The latent-alignment Seq2Seq: closed-form marginal == Pyro enumeration, soft hard reads ==
passes with a constant memory, generation, validation."""

from __future__ import annotations

import pyro
import pytest
import torch
from pyro.infer import TraceEnum_ELBO

from bayesattn.functional.alignment import mixture_log_probs
from bayesattn.nn.alignment import LatentAlignment, decoder_alignment, enumerated_alignment_model
from bayesattn.nn.networks import Seq2Seq

SMALL = dict(d_model=8, nhead=2, num_encoder_layers=1, dim_feedforward=16, dropout=0.0, max_len=8)


def _net(alignment: str = "latent", seed: int = 0, **kw) -> Seq2Seq:
    torch.manual_seed(seed)
    # the one-word emission (the context emission has its own tests: test_context_emission)
    kw.setdefault("emission", "word")
    return Seq2Seq(9, 11, alignment=alignment, **{**SMALL, **kw}).eval()


def _batch(B: int = 3, Ts: int = 5, Tt: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    src = torch.randint(3, 9, (B, Ts), generator=g)
    src[0, -2:] = 0  # padding
    tgt = torch.randint(3, 11, (B, Tt), generator=g)
    tgt[:, 0] = 1  # BOS
    tgt[:, -1] = 2  # EOS
    tgt[1, -2:] = torch.tensor([2, 0])  # an early EOS, then padding
    return src, tgt


def _enum_loss(log_prior, log_em, y, mask) -> float:
    pyro.clear_param_store()
    elbo = TraceEnum_ELBO(max_plate_nesting=2)
    return float(
        elbo.loss(enumerated_alignment_model, lambda *a, **k: None, log_prior, log_em, y, mask)
    )


def test_closed_form_equals_trace_enum_elbo_on_random_tensors() -> None:
    g = torch.Generator().manual_seed(0)
    B, T, Ts, V = 3, 4, 5, 6
    log_prior = torch.log_softmax(torch.randn(B, T, Ts, generator=g, dtype=torch.float64), -1)
    log_em = torch.log_softmax(torch.randn(B, T, Ts, V, generator=g, dtype=torch.float64), -1)
    y = torch.randint(0, V, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[0, -1] = False
    closed = mixture_log_probs(log_prior, log_em).gather(-1, y[..., None]).squeeze(-1)
    assert _enum_loss(log_prior, log_em, y, mask) == pytest.approx(-float(closed[mask].sum()))


def test_network_likelihood_equals_trace_enum_elbo() -> None:
    net = _net()
    src, tgt = _batch()
    with torch.no_grad():
        mem, pad = net.encode(src)
        h = net.decoder(net.tgt_embed(tgt[:, :-1]))
        log_prior = net.latent.log_prior(h, mem, pad)
        log_em = net.latent.log_emissions(h, src)
        logits = net(src, tgt)
    y, mask = tgt[:, 1:], tgt[:, 1:] != net.pad_id
    # the network's logits are the marginal log-probabilities: log p(y) as Pyro scores it
    closed = -net.likelihood(logits, mask, 1).log_prob(y).sum()
    assert torch.allclose(torch.logsumexp(logits, -1), torch.zeros(()), atol=1e-5)
    assert _enum_loss(log_prior, log_em, y, mask) == pytest.approx(float(closed), rel=1e-5)
    assert (log_prior[0, :, -2:] == float("-inf")).all()  # padded source positions


def test_soft_hard_reads_equal_passes_with_a_constant_memory() -> None:
    """The soft decoder's output for a one-hot read of position j equals a normal pass whose
    memory holds m_j at every position (then any attention weights read v_j)."""
    net = _net("soft", num_decoder_layers=2)
    src, tgt = _batch()
    with torch.no_grad():
        mem, pad = net.encode(src)
        h = net.tgt_embed(tgt[:, :-1])
        out, weights, hard = decoder_alignment(net.decoder, h, mem, pad)
        assert torch.allclose(out, net.decoder(h, mem, memory_key_padding_mask=pad), atol=1e-6)
        assert weights.shape == (3, 2, 5, 5)  # (B, H, Tt-1, Ts)
        for j in range(mem.shape[1]):
            const = mem[:, j : j + 1].expand_as(mem)
            # the lower layer keeps the real memory; only the last layer's read is forced
            x = net.decoder.layers[0](h, mem, tgt_mask=_causal(h), memory_key_padding_mask=pad,
                                      tgt_is_causal=True)  # fmt: skip
            y = net.decoder.layers[1](x, const, tgt_mask=_causal(h), tgt_is_causal=True)
            y = net.decoder.norm(y) if net.decoder.norm is not None else y
            assert torch.allclose(hard[:, :, j], y, atol=1e-5)


def _causal(h: torch.Tensor) -> torch.Tensor:
    T = h.shape[-2]
    return torch.ones(T, T, dtype=torch.bool).triu(1)


def test_alignment_terms_shapes_and_samples() -> None:
    src, tgt = _batch()
    for kind in ("soft", "latent"):
        net = _net(kind)
        with torch.no_grad():
            lp, ll, logits = net.alignment_terms(src, tgt, num_samples=2)
        assert lp.shape == ll.shape == (2, 3, 5, 5)
        assert logits.shape == (2, 3, 5, 11)
        assert torch.allclose(lp.exp().sum(-1), torch.ones(2, 3, 5), atol=1e-5)
        assert (ll <= 0).all()


def test_latent_generation_and_uncertainty() -> None:
    net = _net()
    src, _ = _batch()
    gen = net.generate(src, max_len=4, num_samples=2)
    assert gen.tokens.shape[0] == 3 and gen.tokens.shape[1] <= 4
    assert torch.allclose(gen.probs.sum(-1), torch.ones_like(gen.probs[..., 0]), atol=1e-5)
    assert (gen.mutual_information >= -1e-6).all()


def test_latent_trains_by_its_marginal_likelihood() -> None:
    net = _net().train()
    src, tgt = _batch()
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    losses = []
    for _ in range(30):
        opt.zero_grad()
        loss, _ = net.elbo_loss(src, tgt)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < 0.5 * losses[0]


def test_validation() -> None:
    with pytest.raises(ValueError, match="alignment must be one of .*'soft', 'latent', 'variational'.*got 'hard'"):
        Seq2Seq(9, 11, alignment="hard", **SMALL)
    net = _net()
    src, tgt = _batch()
    mem, pad = net.encode(src)
    with pytest.raises(ValueError, match="decodes with the source tokens src"):
        net.decode(tgt[:, :-1], mem, pad)
    with pytest.raises(ValueError, match="no soft output head"):
        _ = net._head
    with pytest.raises(ValueError, match="vocab_size"):
        LatentAlignment(8, 5, 0, 16)
    with pytest.raises(ValueError, match="must agree"):
        enumerated_alignment_model(torch.zeros(2, 3, 4), torch.zeros(2, 3, 5, 6), torch.zeros(2, 4))
    with pytest.raises(ValueError, match="cross_attention=True"):
        decoder_alignment(_net("latent").decoder, mem, mem)
