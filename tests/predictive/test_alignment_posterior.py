"""alignment_posterior against brute-force Bayes rule: p(y_t | z_t = j) from passes with the
alignment forced to j, p(y_t) from the network's own predictive."""

from __future__ import annotations

from unittest import mock

import pytest
import torch

from bayesattn.diagnostics import alignment_to_arviz
from bayesattn.nn.blocks import AttentionConfig
from bayesattn.nn.networks import Seq2Seq
from bayesattn.predictive import alignment_posterior

SMALL = dict(d_model=8, nhead=2, num_encoder_layers=1, num_decoder_layers=1, dim_feedforward=16,
             dropout=0.0, max_len=8)  # fmt: skip


def _net(alignment: str = "latent", seed: int = 0, **kw) -> Seq2Seq:
    torch.manual_seed(seed)
    # the one-word emission (the context emission has its own tests: test_context_emission)
    kw.setdefault("emission", "word")
    return Seq2Seq(9, 11, alignment=alignment, **{**SMALL, **kw}).eval()


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    src = torch.tensor([[3, 4, 5, 0], [6, 7, 8, 3]])
    tgt = torch.tensor([[1, 4, 5, 2, 0], [1, 6, 7, 8, 2]])
    return src, tgt


def _token_probs(net: Seq2Seq, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
    """p(y_t | …) of the observed tokens from a plain forward pass ``(B, Tt-1)``."""
    with torch.no_grad():
        p = torch.softmax(net(src, tgt), -1)
    return p.gather(-1, tgt[:, 1:, None]).squeeze(-1)


def test_latent_posterior_is_brute_force_bayes_rule() -> None:
    net = _net()
    src, tgt = _batch()
    ap = alignment_posterior(net, src, tgt)
    marginal = _token_probs(net, src, tgt)  # p(y_t | x, y_<t), (B, T)
    Ts = src.shape[1]
    for j in range(Ts):

        def one_hot(h, memory, key_padding_mask=None, j=j):
            out = torch.full((*h.shape[:-1], Ts), float("-inf"))
            out[..., j] = 0.0
            return out

        with mock.patch.object(net.latent, "log_prior", one_hot):
            lik_j = _token_probs(net, src, tgt)  # p(y_t | z_t = j)
        want = ap.prior[..., j] * lik_j / marginal  # Bayes' rule
        assert torch.allclose(ap.posterior[..., j], want, atol=1e-5)
    assert torch.allclose(ap.probs[0].gather(-1, tgt[:, 1:, None]).squeeze(-1), marginal)


def test_soft_posterior_attention_is_bayes_rule_over_hard_reads() -> None:
    """Shankar & Sarawagi: posterior ∝ attention × p(y | read only position j); p(y | j) from a
    pass whose memory holds m_j everywhere (any weights then read v_j)."""
    net = _net("soft")
    src, tgt = _batch()
    ap = alignment_posterior(net, src, tgt)
    with torch.no_grad():
        mem, pad = net.encode(src)
    for j in range(src.shape[1]):
        const = mem[:, j : j + 1].expand_as(mem)
        with mock.patch.object(net, "encode", lambda s, n=1, c=const: (c, None)):
            lik_j = _token_probs(net, src, tgt)
        joint_j = ap.prior[..., j] * lik_j
        if j == 0:
            joint = torch.zeros(*joint_j.shape, src.shape[1])
        joint[..., j] = joint_j
    assert torch.allclose(ap.posterior, joint / joint.sum(-1, keepdim=True), atol=1e-5)


def test_draws_members_kl_and_disagreement() -> None:
    src, tgt = _batch()
    fam = _net("soft", attention=AttentionConfig(family="dirichlet", which=("cross",)))
    ap = alignment_posterior(fam, src, tgt, num_samples=3)
    assert ap.log_prior.shape == ap.log_posterior.shape == (3, 2, 4, 4)
    assert ap.probs.shape == (3, 2, 4, 11)
    assert (ap.disagreement() > 0).any()
    assert alignment_posterior(fam, src, tgt, num_samples=3, mode="mean").num_draws == 1
    ens = alignment_posterior([_net("soft", 0), _net("soft", 1)], src, tgt)
    assert ens.num_draws == 2 and (ens.disagreement("prior") > 0).any()
    one = alignment_posterior(_net(), src, tgt, num_samples=5)  # deterministic: one draw
    assert one.num_draws == 1 and torch.equal(one.disagreement(), torch.zeros(2, 4))
    kl = one.kl()
    assert kl.shape == (2, 4) and (kl >= -1e-6).all()
    assert (one.posterior[0, :, -1] == 0).all()  # the padded source word is never a link
    assert torch.equal(one.tgt_mask, tgt[:, 1:] != 0)


def test_validation() -> None:
    src, tgt = _batch()
    with pytest.raises(TypeError, match="model must be a Seq2Seq"):
        alignment_posterior(torch.nn.Linear(2, 2), src, tgt)
    with pytest.raises(TypeError, match="model must be a Seq2Seq"):
        alignment_posterior([], src, tgt)
    with pytest.raises(ValueError, match="mode must be one of"):
        alignment_posterior(_net(), src, tgt, mode="posterior")
    with pytest.raises(ValueError, match="num_samples"):
        alignment_posterior(_net(), src, tgt, num_samples=0)
    with pytest.raises(ValueError, match="same batch size"):
        alignment_posterior(_net(), src, tgt[:1])
    with pytest.raises(ValueError, match="which must be 'prior' or 'posterior'"):
        alignment_posterior(_net(), src, tgt).entropy("both")


def test_arviz_export_positions_and_tokens_are_separate_coordinates() -> None:
    src, tgt = _batch()
    ap = alignment_posterior(_net(), src, tgt)
    idata = alignment_to_arviz(
        ap, [["i", "see", "it"], ["we", "buy", "the", "car"]],
        [["ich", "sehe", "<eos>"], ["wir", "kaufen", "das", "auto"]],
    )  # fmt: skip
    post = idata.posterior["alignment_posterior"]
    assert post.dims == ("chain", "draw", "example", "target", "source")
    assert post.shape == (1, 1, 2, 4, 4)
    assert list(post.target.values) == [0, 1, 2, 3]
    assert post.target_token.dims == ("example", "target")
    assert list(post.source_token.sel(example=0).values) == ["i", "see", "it", "<pad>"]
    row = post.sel(example=1).where(post.sel(example=1).target_token == "das", drop=True)
    assert row.target.values.tolist() == [2]
    assert torch.allclose(torch.as_tensor(row.values).reshape(-1).float(), ap.posterior[1, 2])
    kl = idata.posterior["alignment_kl"]
    assert kl.dims == ("chain", "draw", "example", "target")
    assert torch.allclose(torch.as_tensor(kl.values[0, 0]).float(), ap.kl(), atol=1e-6)
    with pytest.raises(ValueError, match="src_tokens must hold one token list per example"):
        alignment_to_arviz(ap, [["a"]], [["b"], ["c"]])
    with pytest.raises(ValueError, match="tgt_tokens\\[0\\] has 5 tokens"):
        alignment_to_arviz(ap, [["a"], ["b"]], [["b"] * 5, ["c"]])
    with pytest.raises(TypeError, match="src_tokens\\[1\\] must be a sequence of str"):
        alignment_to_arviz(ap, [["a"], "b"], [["b"], ["c"]])
